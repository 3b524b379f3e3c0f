package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paystream/paystream/internal/console"
)

type consoleCmd struct {
	dbFlags
	kafkaFlags
	metricsFlags
	Addr           string        `help:"Address the console listens on." default:"127.0.0.1:8090" env:"PAYSTREAM_CONSOLE_ADDR"`
	AuthFile       string        `help:"Secrets file of user:password lines (bcrypt hashes, as htpasswd -nbB prints them): HTTP basic auth." env:"PAYSTREAM_CONSOLE_AUTH_FILE" placeholder:"FILE"`
	AuthHeader     string        `help:"Header an authenticating proxy in front of the console sets to the signed-in user (e.g. X-Forwarded-User), instead of --auth-file." env:"PAYSTREAM_CONSOLE_AUTH_HEADER" placeholder:"HEADER"`
	TrustedProxies []string      `help:"Addresses (CIDR) requests carrying --auth-header must come from." default:"127.0.0.0/8,::1/128" env:"PAYSTREAM_CONSOLE_TRUSTED_PROXIES"`
	Group          string        `help:"The processor's consumer group." default:"paystream-processor" env:"PAYSTREAM_GROUP"`
	RawTopic       string        `help:"Raw webhook topic." default:"${raw_topic}" env:"PAYSTREAM_RAW_TOPIC"`
	DLQTopic       string        `help:"Dead-letter topic." default:"${dlq_topic}" env:"PAYSTREAM_DLQ_TOPIC"`
	ReplaysTopic   string        `help:"Compacted topic recording which DLQ records were replayed." default:"paystream.webhooks.dlq-replays.v1" env:"PAYSTREAM_DLQ_REPLAYS_TOPIC"`
	SourcesFile    string        `help:"Sources file named in the replay commands the stuck page shows." default:"sources.yaml" env:"PAYSTREAM_SOURCES" placeholder:"FILE"`
	DLQWindow      time.Duration `help:"How far back the stuck page reads the DLQ topic." default:"168h" env:"PAYSTREAM_CONSOLE_DLQ_WINDOW"`
	ShowBodies     bool          `help:"Show each delivery's kept webhook body on the payment page (customers' data: off by default)." env:"PAYSTREAM_CONSOLE_SHOW_BODIES"`
	DBMaxConns     int32         `help:"Most Postgres connections (pool_max_conns in the URL wins)." default:"4" env:"PAYSTREAM_CONSOLE_DB_MAX_CONNS"`
}

func (c *consoleCmd) Help() string {
	return `A read-only web console for support and operators: a payment's story (search by payment key,
gateway id or event id), the stuck work (held payments, quarantined and deferred deliveries,
dead-lettered webhooks with their replay command) and the pipeline's health (per partition lag
and owner, the relay's slot lag, retention). It writes nothing: connect it with a read-only role
(docs/console.md has the grants); its sessions are read-only too. Kafka is optional: without
--kafka-brokers the lag, owner and DLQ sections say so.

  paystream console --auth-file /etc/paystream/console-users --addr :8090`
}

func (c *consoleCmd) Run(ctx context.Context, e *env) error {
	if c.AuthFile == "" && c.AuthHeader == "" {
		return errors.New("no authentication: set --auth-file (PAYSTREAM_CONSOLE_AUTH_FILE) or --auth-header (PAYSTREAM_CONSOLE_AUTH_HEADER); the console never serves open")
	}
	if err := c.required(); err != nil {
		return err
	}
	auth := console.Auth{BasicFile: c.AuthFile, Header: c.AuthHeader}
	for _, s := range c.TrustedProxies {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return fmt.Errorf("--trusted-proxies: %w", err)
		}
		auth.TrustedProxies = append(auth.TrustedProxies, p)
	}
	cfg := console.Config{
		Auth: auth, Group: c.Group, RawTopic: c.RawTopic, DLQTopic: c.DLQTopic, ReplaysTopic: c.ReplaysTopic,
		SourcesFile: c.SourcesFile, DLQWindow: c.DLQWindow, ShowBodies: c.ShowBodies,
		Logger: e.log.With("component", "console"), Registerer: e.reg,
	}
	if len(c.KafkaBrokers) > 0 {
		brokers, opts, err := c.kafka(e.log)
		if err != nil {
			return err
		}
		if err := c.checkKafka(ctx, e.log, brokers); err != nil {
			return err
		}
		cfg.Brokers, cfg.KafkaOpts = brokers, opts
	} else {
		e.log.Warn("no --kafka-brokers: the console shows no lag, owners or DLQ")
	}
	pool, err := c.sizedPool(ctx, c.DBMaxConns, func(pc *pgxpool.Config) {
		// Every session read-only, whatever the role may do.
		pc.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	})
	if err != nil {
		return err
	}
	defer pool.Close()
	srv, err := console.New(pool, cfg)
	if err != nil {
		return err
	}
	defer srv.Close()
	if err := serveMetrics(ctx, e, c.MetricsAddr, nil); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", c.Addr)
	if err != nil {
		return fmt.Errorf("console listen: %w", err)
	}
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 5 * time.Second, WriteTimeout: time.Minute}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	}()
	e.log.Info("console listening", "addr", ln.Addr().String(), "auth", authMode(auth))
	if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("console serve: %w", err)
	}
	return nil
}

func authMode(a console.Auth) string {
	if a.Header != "" {
		return "header " + a.Header
	}
	return "basic"
}
