package topics

import "testing"

func TestSafeToSet(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		key, have, want string
		safe            bool
	}{
		{ConfigRetentionMs, "", "604800000", true},
		{ConfigRetentionMs, "3600000", "604800000", true},
		{ConfigRetentionMs, "2592000000", "604800000", false}, // shortening deletes data
		{ConfigRetentionMs, "-1", "604800000", false},
		{ConfigMaxMessageBytes, "1048588", "1463640", true},
		{ConfigMaxMessageBytes, "2000000", "1463640", false},
		{ConfigMinInsyncReplicas, "1", "2", true},
		{ConfigMinInsyncReplicas, "3", "2", false},
		{ConfigCompressionType, "zstd", "producer", true},
	} {
		if got := safeToSet(c.key, c.have, c.want); got != c.safe {
			t.Errorf("safeToSet(%s, %q, %q) = %v, want %v", c.key, c.have, c.want, got, c.safe)
		}
	}
}

// TestEnsureSetsMinInsyncAtThreeReplicas: specs of 3 or more replicas are
// created with min.insync.replicas=2 (the test broker has one, so this is
// checked on the spec, not on a topic).
func TestEnsureSetsMinInsyncAtThreeReplicas(t *testing.T) {
	t.Parallel()
	l := Layout{Raw: "r", State: "s", DLQ: "d", Partitions: 3, MaxMessageBytes: 2_000_000, ReplicationFactor: 3}
	specs, err := l.Specs()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range specs {
		if got := withMinInsync(s.Configs)[ConfigMinInsyncReplicas]; got != "2" {
			t.Errorf("%s: min.insync.replicas %q, want 2", s.Name, got)
		}
		if _, ok := s.Configs[ConfigMinInsyncReplicas]; ok {
			t.Errorf("%s: withMinInsync changed the spec's own map", s.Name)
		}
	}
}
