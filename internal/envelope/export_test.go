package envelope

import "fmt"

// DecodeRawFast exposes decodeRawFast to the differential tests.
var DecodeRawFast = decodeRawFast

// DecodeRawJSON is DecodeRaw as it was before decodeRawFast: encoding/json
// alone, then the same validation. The tests hold DecodeRaw to it.
func DecodeRawJSON(b []byte) (Raw, error) {
	r, err := decodeRawJSON(b)
	if err != nil {
		return Raw{}, fmt.Errorf("%w: %v", ErrUndecodable, err)
	}
	if err := validateRaw(&r); err != nil {
		return Raw{}, err
	}
	return r, nil
}
