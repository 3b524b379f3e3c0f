package console

import (
	"fmt"
	"html/template"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/paystream/paystream/internal/money"
)

// funcs are the templates' helpers.
var funcs = template.FuncMap{
	"money":      formatMoney,
	"ts":         formatTime,
	"tsp":        func(t *time.Time) string { return formatTimePtr(t) },
	"age":        formatAge,
	"bytes":      formatBytes,
	"paymentURL": paymentURL,
	"cursorURL":  cursorURL,
	"window":     formatWindow,
	"body":       formatBody,
	"eventID":    func(key string, version int64) string { return key + ":" + strconv.FormatInt(version, 10) },
}

// formatMoney renders minor units in the currency's major unit with its
// ISO 4217 exponent: 10050 BRL is "100.50 BRL", 1500 JPY "1500 JPY". An
// unknown or empty currency shows the minor units as they are.
func formatMoney(minor int64, currency string) string {
	if currency == "" {
		return strconv.FormatInt(minor, 10)
	}
	if _, ok := money.Exponent(currency); !ok {
		return strconv.FormatInt(minor, 10) + " " + currency + " (minor units)"
	}
	return groupThousands(money.Format(minor, currency)) + " " + currency
}

// groupThousands puts a thin space between groups of three digits of the
// integer part: 1234567.89 is "1 234 567.89".
func groupThousands(s string) string {
	sign := ""
	if strings.HasPrefix(s, "-") {
		sign, s = "-", s[1:]
	}
	intPart, frac, hasFrac := strings.Cut(s, ".")
	var b strings.Builder
	for i, c := range intPart {
		if i > 0 && (len(intPart)-i)%3 == 0 {
			b.WriteString("\u2009")
		}
		b.WriteRune(c)
	}
	if hasFrac {
		b.WriteString("." + frac)
	}
	return sign + b.String()
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000Z")
}

func formatTimePtr(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return formatTime(*t)
}

// formatAge is how long ago t was from now, to the largest two units.
func formatAge(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	if d < 0 {
		return "in the future"
	}
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm %ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh %dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd %dh", int(d.Hours())/24, int(d.Hours())%24)
}

// formatWindow is a look-back window in words: 168h is "7 days".
func formatWindow(d time.Duration) string {
	switch {
	case d == 24*time.Hour:
		return "day"
	case d%(24*time.Hour) == 0:
		return fmt.Sprintf("%d days", d/(24*time.Hour))
	case d%time.Hour == 0:
		return fmt.Sprintf("%d hours", d/time.Hour)
	}
	return d.String()
}

func formatBytes(n int64) string {
	switch {
	case n < 1<<10:
		return fmt.Sprintf("%d B", n)
	case n < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	case n < 1<<30:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
}

func paymentURL(key string) string { return "/payment?key=" + url.QueryEscape(key) }

// formatBody shows a kept body as text when it is UTF-8, else says so.
func formatBody(b []byte) string {
	if b == nil {
		return ""
	}
	if !utf8.Valid(b) {
		return fmt.Sprintf("(%d bytes, not UTF-8)", len(b))
	}
	return string(b)
}
