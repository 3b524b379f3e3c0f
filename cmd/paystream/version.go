package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// version and revision are set at build time, as the Makefile and
// deploy/Dockerfile do:
//
//	go build -ldflags "-X main.version=$(git describe --tags --always --dirty) -X main.revision=$(git rev-parse HEAD)"
//
// Left empty (go install, a plain go build), they are read from what the
// go command stamped into the binary; see buildInfo.
var version, revision string

// build says which paystream this is.
type build struct {
	Version   string // a release tag, `git describe` output, a module pseudo-version, or "dev"
	Revision  string // the commit, or "unknown"
	GoVersion string
}

// buildInfo returns the injected version and revision or, where none was
// injected, what the go command recorded: the module's version (`go
// install …@v1.2.3`, or the pseudo-version with "+dirty" a plain `go build`
// in a checkout stamps) and the VCS revision. "dev" and "unknown" only when
// the binary carries neither (go test, a build with -buildvcs=false).
func buildInfo() build {
	b := build{Version: version, Revision: revision, GoVersion: runtime.Version()}
	if info, ok := debug.ReadBuildInfo(); ok {
		var rev, modified string
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value
			}
		}
		if b.Revision == "" {
			b.Revision = rev
		}
		if b.Version == "" {
			switch v := info.Main.Version; {
			case v != "" && v != "(devel)":
				b.Version = v
			case rev != "":
				b.Version = rev[:min(len(rev), 12)]
				if modified == "true" {
					b.Version += "-dirty"
				}
			}
		}
	}
	if b.Version == "" {
		b.Version = "dev"
	}
	if b.Revision == "" {
		b.Revision = "unknown"
	}
	return b
}

// buildInfoMetric is paystream_build_info{version,revision,goversion} 1,
// on the registry of every command (so on every /metrics it serves).
func buildInfoMetric(b build) prometheus.Collector {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "paystream_build_info",
		Help: "Always 1; its labels say which paystream this is: the version and commit it was built from, and the Go release.",
	}, []string{"version", "revision", "goversion"})
	g.WithLabelValues(b.Version, b.Revision, b.GoVersion).Set(1)
	return g
}

type versionCmd struct{}

func (versionCmd) Run() error {
	b := buildInfo()
	fmt.Printf("paystream %s\nrevision %s\ngo %s\n", b.Version, b.Revision, b.GoVersion)
	return nil
}
