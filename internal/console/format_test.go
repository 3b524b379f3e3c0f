package console

import (
	"testing"
	"time"
)

func TestFormatMoney(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		minor    int64
		currency string
		want     string
	}{
		{105000, "BRL", "1\u2009050.00 BRL"},
		{5, "USD", "0.05 USD"},
		{-5000, "BRL", "-50.00 BRL"},
		{1500, "JPY", "1\u2009500 JPY"},
		{1234567, "KWD", "1\u2009234.567 KWD"},
		{123456789, "CLP", "123\u2009456\u2009789 CLP"},
		{1050, "XYZ", "1050 XYZ (minor units)"},
		{1050, "", "1050"},
	} {
		if got := formatMoney(tc.minor, tc.currency); got != tc.want {
			t.Errorf("formatMoney(%d, %q) = %q, want %q", tc.minor, tc.currency, got, tc.want)
		}
	}
}

func TestFormatAgeAndWindow(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 29, 18, 0, 0, 0, time.UTC)
	for d, want := range map[time.Duration]string{
		42 * time.Second:              "42s",
		3*time.Minute + 5*time.Second: "3m 5s",
		26*time.Hour + 30*time.Minute: "26h 30m",
		5*24*time.Hour + 23*time.Hour: "5d 23h",
		-time.Minute:                  "in the future",
	} {
		if got := formatAge(now, now.Add(-d)); got != want {
			t.Errorf("formatAge(%s ago) = %q, want %q", d, got, want)
		}
	}
	for d, want := range map[time.Duration]string{168 * time.Hour: "7 days", 24 * time.Hour: "day", 6 * time.Hour: "6 hours", 90 * time.Minute: "1h30m0s"} {
		if got := formatWindow(d); got != want {
			t.Errorf("formatWindow(%s) = %q, want %q", d, got, want)
		}
	}
}
