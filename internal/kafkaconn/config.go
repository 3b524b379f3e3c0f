package kafkaconn

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
)

// The SASL mechanisms Config.SASLMechanism accepts.
const (
	MechanismPlain       = "PLAIN"
	MechanismScramSHA256 = "SCRAM-SHA-256"
	MechanismScramSHA512 = "SCRAM-SHA-512"
	MechanismOAuthBearer = "OAUTHBEARER"
	MechanismAWSMSKIAM   = "AWS_MSK_IAM"
)

// Mechanisms lists the SASL mechanisms Config.SASLMechanism accepts.
var Mechanisms = []string{MechanismPlain, MechanismScramSHA256, MechanismScramSHA512, MechanismOAuthBearer, MechanismAWSMSKIAM}

// The flags cmd/paystream gives each setting, named in messages. Each is
// also the environment variable PAYSTREAM_ and the flag's name in upper
// snake case (--kafka-tls-ca-file: PAYSTREAM_KAFKA_TLS_CA_FILE).
const (
	flagBrokers        = "--kafka-brokers"
	flagTLS            = "--kafka-tls"
	flagCAFile         = "--kafka-tls-ca-file"
	flagCertFile       = "--kafka-tls-cert-file"
	flagKeyFile        = "--kafka-tls-key-file"
	flagServerName     = "--kafka-tls-server-name"
	flagMechanism      = "--kafka-sasl-mechanism"
	flagUsername       = "--kafka-sasl-username"
	flagPassword       = "--kafka-sasl-password"
	flagPasswordFile   = "--kafka-sasl-password-file"
	flagOAuthTokenFile = "--kafka-sasl-oauth-token-file"
)

// The AWS credentials AWS_MSK_IAM reads from the environment at each
// authentication.
const (
	envAWSAccessKeyID     = "AWS_ACCESS_KEY_ID"
	envAWSSecretAccessKey = "AWS_SECRET_ACCESS_KEY"
	envAWSSessionToken    = "AWS_SESSION_TOKEN"
)

// Config is how to reach and authenticate to a Kafka cluster.
type Config struct {
	// Brokers are the seed brokers, host:port (a missing port is 9092).
	// Required.
	Brokers []string

	// TLS dials the brokers with TLS (1.2 or newer), verifying their
	// certificates against TLSCAFile or the system's roots. Setting any
	// other TLS field turns it on too. Defaults to off (plaintext).
	TLS bool
	// TLSCAFile is a PEM file of the certificate authorities the brokers'
	// certificates must chain to. Defaults to the system's roots.
	TLSCAFile string
	// TLSCertFile and TLSKeyFile are a PEM client certificate and its key,
	// presented to brokers that authenticate clients by certificate
	// (mutual TLS, e.g. Aiven's default). Both or neither; they are read
	// again at each TLS handshake, so a renewed certificate is picked up.
	// Defaults to no client certificate.
	TLSCertFile string
	TLSKeyFile  string
	// TLSServerName is the name the brokers' certificates must carry.
	// Defaults to the host of each broker dialed.
	TLSServerName string

	// SASLMechanism is the SASL mechanism: "" (none), PLAIN,
	// SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER or AWS_MSK_IAM (credentials
	// from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN,
	// read at each authentication). Case does not matter. Defaults to ""
	// (no SASL).
	SASLMechanism string
	// SASLUsername is the PLAIN or SCRAM user. Defaults to "".
	SASLUsername string
	// SASLPassword is the PLAIN or SCRAM password itself. Prefer
	// SASLPasswordFile. Defaults to "".
	SASLPassword string
	// SASLPasswordFile is a file holding the PLAIN or SCRAM password (a
	// trailing newline is ignored), read at each authentication so a
	// rotated password is picked up. Defaults to "".
	SASLPasswordFile string
	// SASLOAuthTokenFile is a file holding the OAUTHBEARER token, read at
	// each authentication so a token refreshed by another process (a
	// sidecar, a projected volume) is picked up. Defaults to "".
	SASLOAuthTokenFile string
}

// mechanism is SASLMechanism in canonical form.
func (c Config) mechanism() string {
	return strings.ToUpper(strings.TrimSpace(c.SASLMechanism))
}

// tlsOn reports whether the brokers are dialed with TLS.
func (c Config) tlsOn() bool {
	return c.TLS || c.TLSCAFile != "" || c.TLSCertFile != "" || c.TLSKeyFile != "" || c.TLSServerName != ""
}

// Error is a Kafka connection setting or failure explained in one line,
// naming the setting to check.
type Error struct {
	msg string
	err error
}

func (e *Error) Error() string { return "kafka: " + e.msg }

// Unwrap returns the underlying error, if any.
func (e *Error) Unwrap() error { return e.err }

func errorf(err error, format string, args ...any) *Error {
	return &Error{msg: fmt.Sprintf(format, args...), err: err}
}

// Validate checks every setting, reading the files they name, and returns
// the first problem in one line naming its flag, e.g.
// `kafka: --kafka-tls-ca-file /x: no such file`.
func (c Config) Validate() error {
	if len(c.Brokers) == 0 {
		return errorf(nil, "%s: no brokers (set it or PAYSTREAM_KAFKA_BROKERS)", flagBrokers)
	}
	for _, b := range c.Brokers {
		if t := strings.TrimSpace(b); t == "" || strings.ContainsAny(t, " \t/") {
			return errorf(nil, "%s %q: want HOST:PORT", flagBrokers, b)
		}
	}
	if err := c.validateTLS(); err != nil {
		return err
	}
	return c.validateSASL()
}

func (c Config) validateTLS() error {
	if c.TLSCAFile != "" {
		if _, err := loadCAs(c.TLSCAFile); err != nil {
			return err
		}
	}
	switch {
	case c.TLSCertFile != "" && c.TLSKeyFile == "":
		return errorf(nil, "%s is set but %s is not: a client certificate needs its key", flagCertFile, flagKeyFile)
	case c.TLSKeyFile != "" && c.TLSCertFile == "":
		return errorf(nil, "%s is set but %s is not: a client key needs its certificate", flagKeyFile, flagCertFile)
	case c.TLSCertFile != "":
		if _, err := loadClientCert(c.TLSCertFile, c.TLSKeyFile); err != nil {
			return err
		}
	}
	if strings.ContainsAny(c.TLSServerName, " \t/:") {
		return errorf(nil, "%s %q: want a host name", flagServerName, c.TLSServerName)
	}
	return nil
}

func (c Config) validateSASL() error {
	mech := c.mechanism()
	userPass := mech == MechanismPlain || mech == MechanismScramSHA256 || mech == MechanismScramSHA512
	switch mech {
	case "":
		for _, s := range []struct{ flag, value string }{
			{flagUsername, c.SASLUsername}, {flagPassword, c.SASLPassword},
			{flagPasswordFile, c.SASLPasswordFile}, {flagOAuthTokenFile, c.SASLOAuthTokenFile},
		} {
			if s.value != "" {
				return errorf(nil, "%s is set but %s is not: set the mechanism (%s)", s.flag, flagMechanism, strings.Join(Mechanisms, ", "))
			}
		}
		return nil
	case MechanismPlain, MechanismScramSHA256, MechanismScramSHA512:
	case MechanismOAuthBearer:
		if c.SASLOAuthTokenFile == "" {
			return errorf(nil, "%s %s needs %s", flagMechanism, mech, flagOAuthTokenFile)
		}
		if _, err := c.oauthToken(); err != nil {
			return err
		}
	case MechanismAWSMSKIAM:
		if !c.tlsOn() {
			return errorf(nil, "%s %s needs %s (MSK's IAM listener, port 9098, is TLS only)", flagMechanism, mech, flagTLS)
		}
		if _, err := awsAuth(); err != nil {
			return err
		}
	default:
		return errorf(nil, "%s %q: want one of %s", flagMechanism, c.SASLMechanism, strings.Join(Mechanisms, ", "))
	}
	if !userPass {
		for _, s := range []struct{ flag, value string }{
			{flagUsername, c.SASLUsername}, {flagPassword, c.SASLPassword}, {flagPasswordFile, c.SASLPasswordFile},
		} {
			if s.value != "" {
				return errorf(nil, "%s is set but %s %s takes no user name or password", s.flag, flagMechanism, mech)
			}
		}
		if mech != MechanismOAuthBearer && c.SASLOAuthTokenFile != "" {
			return errorf(nil, "%s is set but %s is %s, not %s", flagOAuthTokenFile, flagMechanism, mech, MechanismOAuthBearer)
		}
		return nil
	}
	switch {
	case c.SASLOAuthTokenFile != "":
		return errorf(nil, "%s is set but %s is %s, not %s", flagOAuthTokenFile, flagMechanism, mech, MechanismOAuthBearer)
	case c.SASLUsername == "":
		return errorf(nil, "%s %s needs %s", flagMechanism, mech, flagUsername)
	case c.SASLPassword != "" && c.SASLPasswordFile != "":
		return errorf(nil, "both %s and %s are set: keep one (the file)", flagPassword, flagPasswordFile)
	case c.SASLPassword == "" && c.SASLPasswordFile == "":
		return errorf(nil, "%s %s needs %s (or %s)", flagMechanism, mech, flagPasswordFile, flagPassword)
	}
	_, err := c.password()
	return err
}

// Warnings returns what is allowed but unsafe in c, one line each, for the
// caller to log at start: PLAIN or OAUTHBEARER without TLS sends the
// password or token in cleartext.
func (c Config) Warnings() []string {
	var out []string
	if mech := c.mechanism(); (mech == MechanismPlain || mech == MechanismOAuthBearer) && !c.tlsOn() {
		out = append(out, fmt.Sprintf("kafka: %s %s without %s sends the %s in cleartext", flagMechanism, mech, flagTLS,
			map[string]string{MechanismPlain: "password", MechanismOAuthBearer: "token"}[mech]))
	}
	return out
}

// password returns the PLAIN or SCRAM password: SASLPassword, or
// SASLPasswordFile's content read now.
func (c Config) password() (string, error) {
	if c.SASLPasswordFile == "" {
		return c.SASLPassword, nil
	}
	b, err := readSecret(flagPasswordFile, c.SASLPasswordFile)
	if err != nil {
		return "", err
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}

// oauthToken returns SASLOAuthTokenFile's content read now.
func (c Config) oauthToken() (string, error) {
	b, err := readSecret(flagOAuthTokenFile, c.SASLOAuthTokenFile)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// readSecret reads a secret file, failing when it is missing or empty.
// Its content never appears in the error.
func readSecret(flag, path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fileError(flag, path, err)
	}
	if strings.TrimSpace(string(b)) == "" {
		return nil, errorf(nil, "%s %s: empty file", flag, path)
	}
	return b, nil
}

// fileError names flag and path and says briefly what is wrong with the
// file.
func fileError(flag, path string, err error) *Error {
	switch {
	case errors.Is(err, os.ErrNotExist):
		return errorf(err, "%s %s: no such file", flag, path)
	case errors.Is(err, os.ErrPermission):
		return errorf(err, "%s %s: permission denied", flag, path)
	}
	var pe *os.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	return errorf(err, "%s %s: %v", flag, path, err)
}

// String describes c without its secrets: the password is "[redacted]"
// when set, files are named but never read.
func (c Config) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "brokers=%s tls=%t", strings.Join(c.Brokers, ","), c.tlsOn())
	for _, f := range []struct{ name, value string }{
		{"ca_file", c.TLSCAFile}, {"cert_file", c.TLSCertFile}, {"key_file", c.TLSKeyFile},
		{"server_name", c.TLSServerName}, {"sasl", c.mechanism()}, {"user", c.SASLUsername},
		{"password", redacted(c.SASLPassword)}, {"password_file", c.SASLPasswordFile},
		{"oauth_token_file", c.SASLOAuthTokenFile},
	} {
		if f.value != "" {
			fmt.Fprintf(&b, " %s=%s", f.name, f.value)
		}
	}
	return b.String()
}

// GoString is String, so %#v does not print the password either.
func (c Config) GoString() string { return "kafkaconn.Config{" + c.String() + "}" }

// LogValue is c for log/slog, without its secrets.
func (c Config) LogValue() slog.Value {
	attrs := []slog.Attr{slog.String("brokers", strings.Join(c.Brokers, ",")), slog.Bool("tls", c.tlsOn())}
	for _, f := range []struct{ name, value string }{
		{"ca_file", c.TLSCAFile}, {"cert_file", c.TLSCertFile}, {"key_file", c.TLSKeyFile},
		{"server_name", c.TLSServerName}, {"sasl", c.mechanism()}, {"user", c.SASLUsername}, {"password", redacted(c.SASLPassword)},
		{"password_file", c.SASLPasswordFile}, {"oauth_token_file", c.SASLOAuthTokenFile},
	} {
		if f.value != "" {
			attrs = append(attrs, slog.String(f.name, f.value))
		}
	}
	return slog.GroupValue(attrs...)
}

func redacted(secret string) string {
	if secret == "" {
		return ""
	}
	return "[redacted]"
}
