#!/usr/bin/env bash
# The one command that runs every test of github.com/rolter/caddy-ratelimit:
#
#   ./test.sh [extra go test args, e.g. -run TestX -v]
#
# 1. installs redis-server, redis-tools, gcc, node and prometheus (apt) when they are
#    missing (as root; otherwise it says what to install), and the
#    providers' SDKs of testdata/sdk (npm ci, unless node_modules matches
#    the lock file),
# 2. go mod download and go vet -race ./...,
# 3. go test -race -count=1 ./... under internal/redistest/cmd/withredis, which
#    starts a throwaway redis-server on a free loopback port and exports
#    ROLTER_TEST_REDIS_URL: the Redis tests run (with CI=true, as .ci/run
#    runs this, a Redis test fails rather than skips without it, and the
#    run fails if one skipped anyway). go test's events go through
#    internal/cmd/testsummary, which prints what go test prints and ends
#    with the totals of tests run, passed, failed and skipped,
# 4. beside go test, at a lower priority: golangci-lint (.golangci.yml;
#    installed with go install at GOLANGCI_LINT_VERSION when missing), and a
#    build of Caddy with the plugin the way operators build it (xcaddy,
#    with -race to reuse the tests' compile), checking that the module is
#    in it.
#
# It says what it installs before it does, prints each phase's time as the
# phase ends, and a table of them at the end, passed or failed.
# TEST_JSON=FILE keeps go test's -json events in FILE.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")"

CADDY_VERSION=v2.11.9
# xcaddy is run at this version, not required by go.mod: a requirement of the
# module would be one of every operator's build too.
XCADDY_VERSION=v0.4.5
GOLANGCI_LINT_VERSION=v2.15.0
MODULE=github.com/rolter/caddy-ratelimit
MODULE_ID=http.handlers.rolter_ratelimit
# go test's timeout for each package's test binary. The root package's tests
# take 3 to 6 minutes on 2 loaded cores, and go test's default, 10 minutes,
# would fail them under more load; a hung test still fails the run, with
# every goroutine's stack.
GO_TEST_TIMEOUT=20m

die() { printf 'test.sh: FAIL: %s\n' "$*" >&2; exit 1; }

# Phases: each is timed from its header to the next one's, and the table of
# them is printed on exit, whatever the outcome.
phase_names=()
phase_ms=()
beside_pids=()
phase=""
phase_start=0
now_ms() { local us=${EPOCHREALTIME/[.,]/}; echo $((us / 1000)); }
seconds() { printf '%d.%d' $(($1 / 1000)) $(($1 % 1000 / 100)); }
begin_phase() {
	end_phase
	phase=$1
	phase_start=$(now_ms)
	printf '\n==== %s ====\n' "$1"
}
end_phase() {
	[[ -n $phase ]] || return 0
	local ms=$(($(now_ms) - phase_start))
	phase_names+=("$phase")
	phase_ms+=("$ms")
	printf -- '---- %s: %ss\n' "$phase" "$(seconds "$ms")"
	phase=""
}
run_start=$(now_ms)
finish() {
	local status=$? pid
	end_phase
	for pid in "${beside_pids[@]}"; do
		[[ -z $pid ]] || kill -- "-$pid" 2>/dev/null || true
	done
	rm -rf "$tmp"
	local total=$(($(now_ms) - run_start)) i
	printf '\n==== time ====\n'
	for i in "${!phase_names[@]}"; do
		printf '%-38s %7ss %4d%%\n' "${phase_names[$i]}" "$(seconds "${phase_ms[$i]}")" $((phase_ms[i] * 100 / (total > 0 ? total : 1)))
	done
	printf '%-38s %7ss\n' "total" "$(seconds "$total")"
	if ((status == 0)); then
		printf '\n==== All tests passed ====\n'
	else
		printf '\n==== test.sh: FAILED (exit %d) ====\n' "$status"
	fi
	exit "$status"
}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/rolter-test.XXXXXX")
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Packages are installed only as root; anyone else is told what to install.
apt_install() {
	if [[ $(id -u) -ne 0 ]]; then
		die "missing packages: install them (apt-get install $*), or run this as root"
	fi
	echo "installing with apt-get: $*"
	apt-get update
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"
}

begin_phase "prerequisites"
command -v go >/dev/null || die "go is not on PATH"
go version
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-cli >/dev/null || missing+=(redis-tools)
# go test -race needs cgo, hence a C compiler.
command -v gcc >/dev/null || missing+=(gcc libc6-dev)
# The providers' SDKs read the gateway's refusals in sdk_test.go.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
	missing+=(nodejs npm)
fi
# dashboards_test.go holds the dashboard and the alert rules to a real
# Prometheus.
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
	missing+=(prometheus)
fi
if ((${#missing[@]})); then
	apt_install "${missing[@]}"
fi
redis-server --version
node --version
prometheus --version 2>&1 | head -1

begin_phase "npm ci (testdata/sdk)"
# npm ci only when node_modules is not what the lock file names: the lock
# file's digest is kept beside what it installed.
lock_sum=$(sha256sum testdata/sdk/package-lock.json | cut -d' ' -f1)
stamp=testdata/sdk/node_modules/.installed-lock-sha256
if [[ $(cat "$stamp" 2>/dev/null) != "$lock_sum" ]]; then
	echo "installing the Anthropic, Google and OpenAI SDKs of testdata/sdk/package-lock.json:" \
		"npm ci into testdata/sdk/node_modules (about 100 MB, 25 MB downloaded)"
	npm ci --prefix testdata/sdk --no-audit --no-fund --ignore-scripts --loglevel=error
	echo "$lock_sum" >"$stamp"
else
	echo "testdata/sdk/node_modules matches package-lock.json"
fi

begin_phase "go mod download"
echo "the modules that build and test this one, into $(go env GOMODCACHE) when missing" \
	"(on a new machine 168 modules: about 190 MB downloaded, 950 MB on disk)"
go mod download

begin_phase "go vet"
# With -race, vet compiles the dependencies as go test -race does, and
# golangci-lint then reads them too: a new machine compiles them once, not
# twice.
go vet -race ./...

# golangci-lint and the xcaddy build run beside go test: its tests mostly
# wait (on timers, on the Caddy and Redis processes they start), and use
# about half a core of two, so the lint and the build take the rest, at a
# lower priority than the tests. On a new machine, where each compiles its
# own dependencies for minutes, that is most of what they cost.
lint="$(go env GOPATH)/bin/golangci-lint"
lint_install=""
if ! "$lint" version 2>/dev/null | grep -q "version ${GOLANGCI_LINT_VERSION#v} "; then
	lint_install=1
fi
lint_job() {
	if [[ -n $lint_install ]]; then
		timed "golangci-lint install" go install "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$GOLANGCI_LINT_VERSION" || return
	fi
	# golangci-lint reads the dependencies' compiled export data: with
	# -race, vet's.
	GOFLAGS="${GOFLAGS:+$GOFLAGS }-race" timed "golangci-lint" "$lint" run ./...
}
# xcaddy resolves and builds Caddy with the module as it does for operators,
# with their build tags and linker flags, but with -race (and so cgo) and
# without -trimpath: then it compiles only the packages those tags select
# differently, and reuses every other one that vet and the tests compiled,
# where its own flags would compile them all again (3 minutes on a new
# machine). What it checks does not depend on those flags: that xcaddy's
# module resolution takes the module, that the build compiles, and that the
# module is in the binary.
xcaddy_job() {
	XCADDY_RACE_DETECTOR=1 XCADDY_GO_BUILD_FLAGS="-ldflags '-w -s' -tags nobadger,nomysql,nopgx" \
		timed "xcaddy build" go run "github.com/caddyserver/xcaddy/cmd/xcaddy@$XCADDY_VERSION" \
		build "$CADDY_VERSION" --with "$MODULE@v0.0.0=." --output "$tmp/caddy" || return
	local modules
	modules=$("$tmp/caddy" list-modules) || die "caddy list-modules failed"
	if ! grep -Fxq "$MODULE_ID" <<<"$modules"; then
		die "$MODULE_ID is not among the modules of the xcaddy-built Caddy"
	fi
	echo "ok: $MODULE_ID is in the xcaddy-built Caddy"
}
# timed NAME COMMAND... runs COMMAND and keeps its time in $tmp/times.
timed() {
	local name=$1 start status=0
	shift
	start=$(now_ms)
	"$@" || status=$?
	echo "$name	$(($(now_ms) - start))" >>"$tmp/times"
	return "$status"
}
export -f lint_job xcaddy_job timed now_ms die
export lint lint_install tmp GOLANGCI_LINT_VERSION XCADDY_VERSION CADDY_VERSION MODULE MODULE_ID
# beside NAME FUNCTION runs FUNCTION in the background, niced, in a session
# of its own (so that an interrupted run stops all it started: finish), its
# output in $tmp/NAME.log.
beside_names=()
beside() {
	setsid nice -n 10 bash -c '"$0"' "$2" >"$tmp/$1.log" 2>&1 &
	beside_names+=("$1")
	beside_pids+=("$!")
}

begin_phase "go test"
if [[ -n $lint_install ]]; then
	echo "installing golangci-lint $GOLANGCI_LINT_VERSION with go install into $(go env GOPATH)/bin, beside go test" \
		"(its modules, about 100 MB more, are downloaded and compiled)"
fi
beside "golangci-lint" lint_job
beside "xcaddy build" xcaddy_job
echo "golangci-lint $GOLANGCI_LINT_VERSION and xcaddy $XCADDY_VERSION (Caddy $CADDY_VERSION with this module) run" \
	"beside go test, at a lower priority; their output follows it"
echo "go test -race -count=1 -timeout $GO_TEST_TIMEOUT ./... $*"
echo "(the root package's tests take several minutes; its ok line comes when they end)"
go build -o "$tmp/" ./internal/redistest/cmd/withredis ./internal/cmd/testsummary
verbose=()
for arg in "$@"; do
	case $arg in -v | -v=true | -test.v | -test.v=true) verbose=(-v) ;; esac
done
# TEST_JSON=FILE keeps go test's events (each test's Elapsed: where the time
# goes).
# -race through GOFLAGS rather than as a flag: the tests' own build of
# ./cmd/caddy (the gateway processes of inflight_test.go) inherits it, and
# reuses the race-compiled dependencies of vet and the tests rather than
# compiling them all again without -race (2 to 3 minutes on a new machine);
# its processes then run with the race detector too.
status=0
GOFLAGS="${GOFLAGS:+$GOFLAGS }-race" "$tmp/withredis" go test -count=1 -timeout "$GO_TEST_TIMEOUT" -json ./... "$@" |
	tee "${TEST_JSON:-/dev/null}" | "$tmp/testsummary" "${verbose[@]}" || status=$?
# Interrupted (Ctrl-C reaches go test, withredis and testsummary, which
# handle it, so bash would go on): stop here, and finish stops the jobs.
((status <= 128)) || exit "$status"
failed=()
((status == 0)) || failed+=("go test")

begin_phase "waiting for golangci-lint and xcaddy"
for i in "${!beside_pids[@]}"; do
	name=${beside_names[$i]}
	status=0
	wait "${beside_pids[$i]}" || status=$?
	beside_pids[i]=""
	printf '\n---- %s (beside go test)\n' "$name"
	if [[ $name == "xcaddy build" && $status -eq 0 ]]; then
		grep -E '^ok: ' "$tmp/$name.log" # and not xcaddy's go get lines
	else
		cat "$tmp/$name.log"
	fi
	((status == 0)) || failed+=("$name")
done
if [[ -f $tmp/times ]]; then
	while IFS=$'\t' read -r name ms; do
		phase_names+=("$name (beside go test)")
		phase_ms+=("$ms")
	done <"$tmp/times"
fi
((${#failed[@]} == 0)) || die "${failed[*]} failed"
