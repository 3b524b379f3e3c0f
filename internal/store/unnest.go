package store

// A statement that writes many rows takes them as arrays, one per column,
// joined back into rows by unnest(): one statement and one plan whatever
// the batch's size. The rows stay structs up to the statement; each
// statement lists its columns, in the order of its unnest() arguments,
// as functions of a row.

// column builds one unnest() argument from rows: the array of a column.
type column[R any] func(rows []R) any

// col is the column of f's values, an array of V.
func col[R, V any](f func(R) V) column[R] {
	return func(rows []R) any {
		out := make([]V, len(rows))
		for i := range rows {
			out[i] = f(rows[i])
		}
		return out
	}
}

// arrays returns the arrays of cols over rows, in order: a statement's
// unnest() arguments.
func arrays[R any](rows []R, cols ...column[R]) []any {
	out := make([]any, len(cols))
	for i, c := range cols {
		out[i] = c(rows)
	}
	return out
}
