package usagetest

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"testing"
)

// RecordedEnv names a folder of real provider responses recorded by other
// projects, with their requests: a manifest.json listing the bodies, each
// with the total its usage reports. The folder is not part of this
// repository, which holds none of its contents: without it the tests that
// read it skip, in CI too.
const RecordedEnv = "ROLTER_PROVIDER_RESPONSES"

// RecordedEntry is what the tests read of a manifest entry.
type RecordedEntry struct {
	File         string          `json:"file"`
	IdentityFile string          `json:"identity_file"` // a compressed body's decoded twin
	ContentType  string          `json:"content_type"`
	Provider     string          `json:"provider"`
	APIPath      string          `json:"api_path"`
	Expected     *int64          `json:"expected_total_tokens"`
	Reported     json.RawMessage `json:"usage_reported"`
	Request      struct {
		Body string `json:"body"` // "" when the recording kept none
	} `json:"request"`
}

// Recorded reads the manifest of the folder RecordedEnv names, and returns
// its entries and a reader of its files; without the folder the test
// skips.
func Recorded(t testing.TB) (entries []RecordedEntry, read func(name string) []byte) {
	t.Helper()
	dir := os.Getenv(RecordedEnv)
	if dir == "" {
		t.Skipf("%s names no folder of recorded responses (one with a manifest.json)", RecordedEnv)
	}
	// Read through an fs.FS: the manifest's names cannot lead out of the folder.
	folder := os.DirFS(dir)
	manifest, err := fs.ReadFile(folder, "manifest.json")
	if errors.Is(err, fs.ErrNotExist) {
		t.Skipf("no recorded responses in %s (set %s to a folder with a manifest.json)", dir, RecordedEnv)
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(manifest, &entries); err != nil {
		t.Fatal(err)
	}
	if len(entries) == 0 {
		t.Fatal("an empty manifest")
	}
	return entries, func(name string) []byte {
		t.Helper()
		b, err := fs.ReadFile(folder, name)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
}
