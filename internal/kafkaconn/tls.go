package kafkaconn

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
)

// tlsConfig is the TLS configuration franz-go dials the brokers with, nil
// when TLS is off. franz-go sets ServerName to the dialed host when it is
// empty.
func (c Config) tlsConfig() (*tls.Config, error) {
	if !c.tlsOn() {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.TLSServerName}
	if c.TLSCAFile != "" {
		pool, err := loadCAs(c.TLSCAFile)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool // nil RootCAs: the system's roots
	}
	if c.TLSCertFile != "" {
		if _, err := loadClientCert(c.TLSCertFile, c.TLSKeyFile); err != nil {
			return nil, err
		}
		certFile, keyFile := c.TLSCertFile, c.TLSKeyFile
		// Read at each handshake: a renewed certificate (cert-manager, a
		// rotated Secret) is used by the next connection.
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			cert, err := loadClientCert(certFile, keyFile)
			if err != nil {
				return nil, err
			}
			return &cert, nil
		}
	}
	return cfg, nil
}

// loadCAs reads a PEM file of CA certificates.
func loadCAs(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fileError(flagCAFile, path, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, errorf(nil, "%s %s: no PEM certificate in it", flagCAFile, path)
	}
	return pool, nil
}

// loadClientCert reads a PEM certificate and its key.
func loadClientCert(certFile, keyFile string) (tls.Certificate, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return tls.Certificate{}, fileError(flagCertFile, certFile, err)
	}
	if block, _ := pem.Decode(certPEM); block == nil || block.Type != "CERTIFICATE" {
		return tls.Certificate{}, errorf(nil, "%s %s: no PEM certificate in it", flagCertFile, certFile)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return tls.Certificate{}, fileError(flagKeyFile, keyFile, err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		// X509KeyPair's messages name neither file nor key material.
		return tls.Certificate{}, errorf(err, "%s %s and %s %s: %v", flagCertFile, certFile, flagKeyFile, keyFile, err)
	}
	return cert, nil
}
