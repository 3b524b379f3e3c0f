package provider

import (
	"crypto/hmac"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"hash"
	"sync"
	"testing"
)

// TestKeyMatchesHMAC checks Key against crypto/hmac for every hash a driver
// uses, with and without a head, from concurrent goroutines (the pool's
// states must never be shared), and after the caller reuses its secret.
func TestKeyMatchesHMAC(t *testing.T) {
	t.Parallel()
	for name, h := range map[string]func() hash.Hash{"sha1": sha1.New, "sha256": sha256.New, "sha512": sha512.New} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			secret := []byte("a secret longer than one hash block, so hmac hashes it first: 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
			want := func(msg string) []byte {
				m := hmac.New(h, secret)
				m.Write([]byte(msg))
				return m.Sum(nil)
			}
			k := NewKey(h, secret)
			cases := []struct {
				body string
				head []string
			}{
				{"", nil},
				{`{"a":1}`, nil},
				{`{"a":1}`, []string{"msg_1", ".", "1718210703", "."}},
				{"", []string{"id:123;", "request-id:abc;", "ts:1718210703;"}},
			}
			want0 := make([][]byte, len(cases))
			for i, c := range cases {
				msg := ""
				for _, p := range c.head {
					msg += p
				}
				want0[i] = want(msg + c.body)
			}
			secret[0] ^= 0xff // the Key kept its own copy
			var wg sync.WaitGroup
			for g := 0; g < 8; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for n := 0; n < 200; n++ {
						i := (g + n) % len(cases)
						m := k.Sum([]byte(cases[i].body), cases[i].head...)
						if !m.Equal(want0[i]) || !hmac.Equal(m.Bytes(), want0[i]) {
							t.Errorf("case %d: Sum = %x, want %x", i, m.Bytes(), want0[i])
							return
						}
						if m.Equal(want0[(i+1)%len(cases)]) || m.Equal(want0[i][:len(want0[i])-1]) {
							t.Errorf("case %d: Equal accepted another MAC or a truncated one", i)
							return
						}
					}
				}()
			}
			wg.Wait()
		})
	}
}
