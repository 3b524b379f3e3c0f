package kafkaconn

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// CheckTimeout bounds [Config.Check].
const CheckTimeout = 15 * time.Second

// ErrUnreachable is wrapped by [Config.Check]'s error when no broker could
// be reached at all (refused, timed out): a cluster that is down or still
// starting, not a setting to fix. Commands that wait for Kafka anyway
// (ingest answers 503 meanwhile) warn and go on.
var ErrUnreachable = errors.New("no broker reachable")

// Check connects to the cluster once (a metadata request to a broker),
// within CheckTimeout, and returns nil when a broker answered. A wrong
// password, token, certificate or TLS setting fails at once with one line
// naming the setting to check ([Config.Explain]); a broker that closes the
// connection at the first request is asked again twice before that is
// believed. When no broker can be reached at all, the error wraps
// [ErrUnreachable]. extra options are added to the check's client.
func (c Config) Check(ctx context.Context, extra ...kgo.Opt) error {
	opts, err := c.Opts()
	if err != nil {
		return err
	}
	var last lastDialed
	cl, err := kgo.NewClient(append(append(opts, extra...), kgo.WithHooks(&last))...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, CheckTimeout)
	defer cancel()
	for attempt := 1; ; attempt++ {
		err := cl.Ping(ctx)
		if err == nil {
			return nil
		}
		addr := last.get(strings.Join(c.Brokers, ","))
		var eof *kgo.ErrFirstReadEOF
		if errors.As(err, &eof) && attempt < 3 && ctx.Err() == nil {
			select {
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond):
				continue
			}
		}
		var explained *Error
		if ex := c.Explain(err, addr); errors.As(ex, &explained) {
			return ex
		}
		if ctx.Err() != nil && !errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w (%v)", err, ctx.Err())
		}
		return fmt.Errorf("kafka: could not reach %s: %v: %w", addr, err, ErrUnreachable)
	}
}

// lastDialed is a franz-go hook remembering the address of the broker
// last dialed, which Ping's error does not name.
type lastDialed struct {
	mu   sync.Mutex
	addr string
}

// OnBrokerConnect implements kgo.HookBrokerConnect.
func (l *lastDialed) OnBrokerConnect(meta kgo.BrokerMetadata, _ time.Duration, _ net.Conn, _ error) {
	l.mu.Lock()
	l.addr = net.JoinHostPort(meta.Host, strconv.Itoa(int(meta.Port)))
	l.mu.Unlock()
}

func (l *lastDialed) get(def string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.addr == "" {
		return def
	}
	return l.addr
}

// Explain turns an authentication or TLS failure that franz-go returned
// for a connection to addr into one line naming what to check, as an
// [*Error]; any other error is returned as is. For example:
//
//	kafka: SASL authentication failed for user "paystream" (SCRAM-SHA-512) at 127.0.0.1:59094: check --kafka-sasl-username and --kafka-sasl-password-file
func (c Config) Explain(err error, addr string) error {
	if err == nil {
		return nil
	}
	var own *Error
	if errors.As(err, &own) {
		return own // a setting, e.g. a password file gone since the start
	}
	mech := c.mechanism()
	if ex := c.explainSASL(err, addr, mech); ex != nil {
		return ex
	}
	if ex := c.explainTLS(err, addr); ex != nil {
		return ex
	}
	// franz-go's guess when a TLS alert comes back to a plaintext request
	// (it has no error type).
	if !c.tlsOn() && strings.Contains(err.Error(), "plaintext connection speaking to a tls endpoint") {
		return errorf(err, "%s answered with TLS: the listener needs TLS: set %s", addr, flagTLS)
	}
	var eof *kgo.ErrFirstReadEOF
	if errors.As(err, &eof) {
		msg := eof.Error()
		switch {
		case strings.Contains(msg, "after a dial") && c.tlsOn():
			return errorf(err, "TLS handshake with %s failed: the broker closed the connection (a plaintext listener?): check %s and the port", addr, flagTLS)
		case strings.Contains(msg, "api versions") && !c.tlsOn():
			return errorf(err, "%s closed the connection at the first request: the listener probably needs TLS: set %s", addr, flagTLS)
		case strings.Contains(msg, "after a request") && mech == "":
			return errorf(err, "%s closed the connection after the first request: the listener probably needs SASL: set %s", addr, flagMechanism)
		}
		return errorf(err, "%s closed the connection at once: check %s and %s against the listener's security protocol", addr, flagTLS, flagMechanism)
	}
	return err
}

func (c Config) explainSASL(err error, addr, mech string) error {
	switch {
	case errors.Is(err, kerr.SaslAuthenticationFailed):
		switch mech {
		case MechanismPlain, MechanismScramSHA256, MechanismScramSHA512:
			pass := flagPassword
			if c.SASLPasswordFile != "" {
				pass = flagPasswordFile
			}
			return errorf(err, "SASL authentication failed for user %q (%s) at %s: check %s and %s", c.SASLUsername, mech, addr, flagUsername, pass)
		case MechanismOAuthBearer:
			return errorf(err, "SASL authentication failed (%s) at %s: the broker rejected the token in %s %s%s", mech, addr, flagOAuthTokenFile, c.SASLOAuthTokenFile, brokerSays(err))
		case MechanismAWSMSKIAM:
			return errorf(err, "SASL authentication failed (%s) at %s: check the AWS credentials (%s, %s, %s) and the IAM policy's kafka-cluster:Connect%s",
				mech, addr, envAWSAccessKeyID, envAWSSecretAccessKey, envAWSSessionToken, brokerSays(err))
		}
		return errorf(err, "SASL authentication failed at %s: check %s%s", addr, flagMechanism, brokerSays(err))
	case errors.Is(err, kerr.UnsupportedSaslMechanism):
		return errorf(err, "the broker at %s does not enable SASL mechanism %s: check %s", addr, mech, flagMechanism)
	case errors.Is(err, kerr.IllegalSaslState):
		return errorf(err, "SASL (%s) handshake with %s failed: check %s and the listener's security protocol%s", mech, addr, flagMechanism, brokerSays(err))
	}
	return nil
}

func (c Config) explainTLS(err error, addr string) error {
	var (
		unknownCA x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
		header    tls.RecordHeaderError
		opErr     *net.OpError
	)
	switch {
	case errors.As(err, &unknownCA):
		if c.TLSCAFile == "" {
			return errorf(err, "TLS: the certificate of %s is signed by an authority the system does not trust: set %s to the cluster's CA", addr, flagCAFile)
		}
		return errorf(err, "TLS: the certificate of %s is not signed by the CA in %s %s: check it", addr, flagCAFile, c.TLSCAFile)
	case errors.As(err, &hostname):
		return errorf(err, "TLS: the certificate of %s %s: check %s (or the broker address)", addr, strings.TrimPrefix(hostname.Error(), "x509: certificate "), flagServerName)
	case errors.As(err, &invalid):
		return errorf(err, "TLS: the certificate of %s is invalid: %s", addr, strings.TrimPrefix(invalid.Error(), "x509: "))
	case errors.As(err, &header):
		return errorf(err, "TLS handshake with %s failed: it does not answer TLS (a plaintext listener?): check %s and the port", addr, flagTLS)
	case errors.As(err, &opErr) && opErr.Op == "remote error" && strings.Contains(opErr.Error(), "tls:"):
		if c.TLSCertFile == "" {
			return errorf(err, "TLS: %s refused the connection (%v): it may want a client certificate: set %s and %s", addr, opErr.Err, flagCertFile, flagKeyFile)
		}
		return errorf(err, "TLS: %s refused the connection (%v): check %s and %s", addr, opErr.Err, flagCertFile, flagKeyFile)
	}
	return nil
}

// brokerSays is the broker's own error message for a Kafka error code,
// when franz-go kept one, as ` (broker: ...)`.
func brokerSays(err error) string {
	var ke *kerr.Error
	if !errors.As(err, &ke) {
		return ""
	}
	_, msg, ok := strings.Cut(err.Error(), ke.Error()+": ")
	if !ok || msg == "" {
		return ""
	}
	return " (broker: " + msg + ")"
}
