package kafkaconn

import (
	"context"
	"os"

	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/aws"
	"github.com/twmb/franz-go/pkg/sasl/oauth"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// saslMechanism is franz-go's mechanism for c, nil without SASL. Every
// secret is read when a connection authenticates, not here: a password or
// token file rewritten by a rotation is used by the next connection.
func (c Config) saslMechanism() sasl.Mechanism {
	user := c.SASLUsername
	switch c.mechanism() {
	case MechanismPlain:
		return plain.Plain(func(context.Context) (plain.Auth, error) {
			pass, err := c.password()
			return plain.Auth{User: user, Pass: pass}, err
		})
	case MechanismScramSHA256, MechanismScramSHA512:
		fn := func(context.Context) (scram.Auth, error) {
			pass, err := c.password()
			return scram.Auth{User: user, Pass: pass}, err
		}
		if c.mechanism() == MechanismScramSHA256 {
			return scram.Sha256(fn)
		}
		return scram.Sha512(fn)
	case MechanismOAuthBearer:
		return oauth.Oauth(func(context.Context) (oauth.Auth, error) {
			token, err := c.oauthToken()
			return oauth.Auth{Token: token}, err
		})
	case MechanismAWSMSKIAM:
		return aws.ManagedStreamingIAM(func(context.Context) (aws.Auth, error) { return awsAuth() })
	}
	return nil
}

// awsAuth reads the AWS credentials from the standard environment
// variables (set by the platform, or by a credential helper that rewrites
// them), now.
func awsAuth() (aws.Auth, error) {
	a := aws.Auth{
		AccessKey:    os.Getenv(envAWSAccessKeyID),
		SecretKey:    os.Getenv(envAWSSecretAccessKey),
		SessionToken: os.Getenv(envAWSSessionToken),
	}
	switch {
	case a.AccessKey == "":
		return aws.Auth{}, errorf(nil, "%s %s needs %s and %s in the environment", flagMechanism, MechanismAWSMSKIAM, envAWSAccessKeyID, envAWSSecretAccessKey)
	case a.SecretKey == "":
		return aws.Auth{}, errorf(nil, "%s %s: %s is set but %s is not", flagMechanism, MechanismAWSMSKIAM, envAWSAccessKeyID, envAWSSecretAccessKey)
	}
	return a, nil
}
