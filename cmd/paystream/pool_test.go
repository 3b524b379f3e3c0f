package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/processor"
)

// TestProcessorPoolSize: the processor's pool is sized from the raw topic's
// partitions (a worker and a sweeper connection each, plus three) unless
// the URL sets pool_max_conns. Before, it had pgx's default of
// max(4, CPUs) connections whatever the partition count, so a replica
// owning more than a few partitions queued its workers for connections.
func TestProcessorPoolSize(t *testing.T) {
	db := testenv.NewDB(t)
	brokers := testenv.Kafka(t)
	topic := testenv.Topic(t, "raw", 7)
	ctx := context.Background()

	seeds := []kgo.Opt{kgo.SeedBrokers(brokers...)}
	partitions, err := topicPartitions(ctx, seeds, topic)
	if err != nil {
		t.Fatal(err)
	}
	if partitions != 7 {
		t.Fatalf("topicPartitions = %d, want 7", partitions)
	}
	if _, err := topicPartitions(ctx, seeds, topic+"-missing"); err == nil {
		t.Error("topicPartitions of a missing topic succeeded")
	}

	for _, c := range []struct {
		url  string
		want int32
	}{
		{db.URL, 17},
		{db.URL + "&pool_max_conns=5", 5},
	} {
		pool, err := dbFlags{DatabaseURL: c.url}.sizedPool(ctx, processor.MaxConns(partitions))
		if err != nil {
			t.Fatal(err)
		}
		if got := pool.Config().MaxConns; got != c.want {
			t.Errorf("pool for %q: MaxConns = %d, want %d", strings.Split(c.url, "?")[1], got, c.want)
		}
		pool.Close()
	}
}

// TestPostgresVerifyFull: with sslmode=verify-full the commands' pool
// connects over TLS to the stack's Postgres, whose certificate names
// localhost, and refuses it under any other name, or signed by another CA,
// in one line saying why.
func TestPostgresVerifyFull(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	tlsURL := db.TLSURL(t)
	ctx := t.Context()

	pool, err := openPool(ctx, tlsURL)
	if err != nil {
		t.Fatalf("verify-full to localhost: %v", err)
	}
	var ssl bool
	if err := pool.QueryRow(ctx, `SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()`).Scan(&ssl); err != nil || !ssl {
		t.Errorf("session over TLS: %t, %v; want true", ssl, err)
	}
	pool.Close()

	// The same server under a name its certificate does not carry: the
	// lookup sends db.example.com to the stack's address.
	wrongHost := strings.Replace(tlsURL, "@localhost:", "@db.example.com:", 1)
	toLoopback := func(cfg *pgxpool.Config) {
		cfg.ConnConfig.LookupFunc = func(context.Context, string) ([]string, error) { return []string{"127.0.0.1"}, nil }
	}
	_, err = openPool(ctx, wrongHost, toLoopback)
	if err == nil || !strings.Contains(err.Error(), "certificate is valid for localhost, not db.example.com") || strings.Contains(err.Error(), "\n") {
		t.Errorf("verify-full to db.example.com: %v; want one line saying the certificate is for localhost", err)
	}

	u, err := url.Parse(tlsURL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("sslrootcert", writeOtherCA(t))
	u.RawQuery = q.Encode()
	if _, err = openPool(ctx, u.String()); err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Errorf("verify-full against another CA: %v; want unknown authority", err)
	}
}

// writeOtherCA writes a CA certificate that signed nothing of the stack's.
func writeOtherCA(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "another CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
