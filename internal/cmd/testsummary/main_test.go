package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
)

// fixtureEvents is what go test -json says of testdata/fixture: a package
// that passes with skips, one whose subtest fails, one whose test never
// ends (stopped by -timeout) and one that does not build. It runs once for
// the tests of this file.
var fixtureEvents = sync.OnceValues(func() ([]byte, error) {
	cmd := exec.Command("go", "test", "-json", "-count=1", "-timeout=2s", "./...")
	cmd.Dir = "testdata/fixture"
	// The fixture is its own module; flags meant for this one (-race) only
	// slow its build.
	cmd.Env = append(os.Environ(), "GOFLAGS=", "GOWORK=off")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if exit := (*exec.ExitError)(nil); errors.As(err, &exit) && len(out) > 0 {
		err = nil // it fails, as it should
	}
	if err != nil {
		err = fmt.Errorf("go test of the fixture: %w\n%s", err, stderr.String())
	}
	return out, err
})

// summary is testsummary's output and exit status on the fixture's events
// of the packages keep accepts (every package when keep is nil).
func summary(t *testing.T, opts options, keep func(event) bool) (string, int) {
	t.Helper()
	events, err := fixtureEvents()
	if err != nil {
		t.Fatal(err)
	}
	var in bytes.Buffer
	for sc := bufio.NewScanner(bytes.NewReader(events)); sc.Scan(); {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("go test -json wrote a line that is no event: %s", sc.Bytes())
		}
		if keep == nil || keep(e) {
			in.Write(sc.Bytes())
			in.WriteByte('\n')
		}
	}
	var out bytes.Buffer
	status := summarise(&in, &out, opts)
	return out.String(), status
}

func inPackage(pkg string) func(event) bool {
	return func(e event) bool { return e.Package == pkg || strings.HasPrefix(e.ImportPath, pkg+" ") }
}

func contains(t *testing.T, out string, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(out, want) {
			t.Errorf("the summary does not say %q:\n%s", want, out)
		}
	}
}

func TestAFailingTestsOutputIsPrintedAndAPassingTestsIsNot(t *testing.T) {
	out, status := summary(t, options{}, nil)
	contains(t, out,
		"    fails_test.go:8: what a failing test says before it fails\n    fails_test.go:9: the failure's message\n--- FAIL: TestFails/sub (",
		"--- FAIL: TestFails (",
		"FAIL\tfixture/fails\t",
		"ok  \tfixture/passes\t")
	if strings.Contains(out, "what a passing test says") || strings.Contains(out, "=== RUN") {
		t.Errorf("the summary prints a passing test's output or test2json's framing:\n%s", out)
	}
	if status != 1 {
		t.Errorf("exit %d with failures, want 1", status)
	}
}

func TestATestThatNeverEndsIsPrintedWithItsStackAndFailsTheRun(t *testing.T) {
	out, status := summary(t, options{}, inPackage("fixture/hangs"))
	contains(t, out,
		"    hangs_test.go:7: what a test that never ends says\npanic: test timed out after 2s",
		"fixture/hangs.TestNeverEnds(",
		"FAIL\tfixture/hangs\t",
		"tests: 1 run (1 top-level, 0 subtests) in 1 packages: 0 passed, 0 failed, 0 skipped, 1 did not finish\n")
	if status != 1 {
		t.Errorf("exit %d, want 1", status)
	}
}

func TestABuildErrorIsPrintedAndFailsTheRun(t *testing.T) {
	out, status := summary(t, options{}, inPackage("fixture/broken"))
	contains(t, out, "broken_test.go:6:39: undefined: undefinedFunction\n", "FAIL\tfixture/broken [build failed]\n")
	if status != 1 {
		t.Errorf("exit %d, want 1", status)
	}
}

func TestTheTotalsCountEveryTestAndSubtestOfEveryPackage(t *testing.T) {
	out, _ := summary(t, options{}, nil)
	contains(t, out, "\ntests: 10 run (7 top-level, 3 subtests) in 4 packages: 4 passed, 2 failed, 3 skipped, 1 did not finish\n",
		"FAIL: 2 tests failed, 1 did not finish, 3 packages failed\n")
}

func TestTheRunEndsWithTheTestsThatFailedOrDidNotFinish(t *testing.T) {
	out, _ := summary(t, options{}, nil)
	contains(t, out, "\nfailed:\n\tfixture/fails TestFails/sub\n\tfixture/fails TestFails\n"+
		"did not finish:\n\tfixture/hangs TestNeverEnds\n"+
		"packages that failed:\n\tfixture/broken\n\tfixture/fails\n\tfixture/hangs\ntests: ")
}

func TestEachSkipIsListedWithItsReason(t *testing.T) {
	out, status := summary(t, options{}, inPackage("fixture/passes"))
	contains(t, out,
		"skipped 2: no recorded responses\n\tfixture/passes TestSkipsForWantOfAFolder\n\tfixture/passes TestSkipsForWantOfAFolderToo\n",
		"skipped 1: set ROLTER_TEST_REDIS_URL to run the Redis tests\n\tfixture/passes TestSkipsForWantOfRedis\n",
		"tests: 6 run (4 top-level, 2 subtests) in 1 packages: 3 passed, 0 failed, 3 skipped\n")
	if status != 0 {
		t.Errorf("exit %d without CI, want 0:\n%s", status, out)
	}
}

func TestInCIASkipForWantOfRedisFailsTheRunAndOtherSkipsDoNot(t *testing.T) {
	out, status := summary(t, options{ci: true}, inPackage("fixture/passes"))
	contains(t, out, "FAIL: CI is set and 1 tests skipped for want of Redis: set ROLTER_TEST_REDIS_URL to run the Redis tests\n")
	if status != 1 {
		t.Errorf("exit %d in CI with a skipped Redis test, want 1", status)
	}
	out, status = summary(t, options{ci: true}, func(e event) bool {
		return inPackage("fixture/passes")(e) && e.Test != "TestSkipsForWantOfRedis"
	})
	if status != 0 {
		t.Errorf("exit %d in CI with other skips alone, want 0:\n%s", status, out)
	}
}

func TestWithVEveryLineIsPrinted(t *testing.T) {
	out, _ := summary(t, options{verbose: true}, inPackage("fixture/passes"))
	contains(t, out, "=== RUN   TestPasses\n", "what a passing test says is not printed\n", "ok  \tfixture/passes\t")
}

func TestALineThatIsNoEventIsPrintedAsItCameAndNoEventFailsTheRun(t *testing.T) {
	var out bytes.Buffer
	status := summarise(strings.NewReader("go: downloading example.com/m v1.0.0\n"), &out, options{})
	contains(t, out.String(), "go: downloading example.com/m v1.0.0\n", "FAIL: no go test -json event was read\n")
	if status != 1 {
		t.Errorf("exit %d without events, want 1", status)
	}
}
