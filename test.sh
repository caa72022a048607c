#!/usr/bin/env bash
# The one command that runs every test of github.com/rolter/caddy-ratelimit:
#
#   ./test.sh [extra go test args, e.g. -run TestX -v]
#
# 1. installs redis-server, redis-tools, gcc and node (apt) when they are
#    missing (as root; otherwise it says what to install), and the
#    providers' SDKs of testdata/sdk (npm ci, unless node_modules matches
#    the lock file),
# 2. go vet ./... and golangci-lint (.golangci.yml; installed with go install
#    at GOLANGCI_LINT_VERSION when missing),
# 3. go test -race -count=1 ./... under internal/redistest/cmd/withredis, which
#    starts a throwaway redis-server on a free loopback port and exports
#    ROLTER_TEST_REDIS_URL: the Redis tests run (with CI=true, as .ci/run
#    runs this, a Redis test fails rather than skips without it, and the
#    run fails if one skipped anyway). go test's events go through
#    internal/cmd/testsummary, which prints what go test prints and ends
#    with the totals of tests run, passed, failed and skipped,
# 4. builds Caddy with the plugin the way operators do (xcaddy) and checks that
#    the module is in it.
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
	local status=$?
	end_phase
	rm -rf "$tmp"
	local total=$(($(now_ms) - run_start)) i
	printf '\n==== time ====\n'
	for i in "${!phase_names[@]}"; do
		printf '%-26s %7ss %4d%%\n' "${phase_names[$i]}" "$(seconds "${phase_ms[$i]}")" $((phase_ms[i] * 100 / (total > 0 ? total : 1)))
	done
	printf '%-26s %7ss\n' "total" "$(seconds "$total")"
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
if ((${#missing[@]})); then
	apt_install "${missing[@]}"
fi
redis-server --version
node --version

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
echo "the modules that build and test this one, into $(go env GOMODCACHE) when missing (about 300 MB on a new machine)"
go mod download

begin_phase "go vet"
# With -race, vet compiles the dependencies as go test -race does, and
# golangci-lint then reads them too: a new machine compiles them once, not
# twice.
go vet -race ./...

lint="$(go env GOPATH)/bin/golangci-lint"
if ! "$lint" version 2>/dev/null | grep -q "version ${GOLANGCI_LINT_VERSION#v} "; then
	begin_phase "golangci-lint install"
	echo "installing golangci-lint $GOLANGCI_LINT_VERSION with go install into $(go env GOPATH)/bin" \
		"(its modules, about 200 MB, are downloaded and compiled)"
	go install "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$GOLANGCI_LINT_VERSION"
fi
begin_phase "golangci-lint"
# golangci-lint reads the dependencies' compiled export data: with -race, vet's.
GOFLAGS="${GOFLAGS:+$GOFLAGS }-race" "$lint" run ./...

begin_phase "go test"
echo "go test -race -count=1 -timeout $GO_TEST_TIMEOUT ./... $*"
echo "(the root package's tests take several minutes; its ok line comes when they end)"
go build -o "$tmp/" ./internal/redistest/cmd/withredis ./internal/cmd/testsummary
verbose=()
for arg in "$@"; do
	case $arg in -v | -v=true | -test.v | -test.v=true) verbose=(-v) ;; esac
done
# TEST_JSON=FILE keeps go test's events (each test's Elapsed: where the time
# goes).
"$tmp/withredis" go test -race -count=1 -timeout "$GO_TEST_TIMEOUT" -json ./... "$@" |
	tee "${TEST_JSON:-/dev/null}" | "$tmp/testsummary" "${verbose[@]}"

begin_phase "xcaddy build"
echo "xcaddy $XCADDY_VERSION (go run, downloaded once) builds Caddy $CADDY_VERSION with this module, without -race"
go run "github.com/caddyserver/xcaddy/cmd/xcaddy@$XCADDY_VERSION" \
	build "$CADDY_VERSION" --with "$MODULE@v0.0.0=." --output "$tmp/caddy"
modules=$("$tmp/caddy" list-modules) || die "caddy list-modules failed"
if ! grep -Fxq "$MODULE_ID" <<<"$modules"; then
	die "$MODULE_ID is not among the modules of the xcaddy-built Caddy"
fi
echo "ok: $MODULE_ID is in the xcaddy-built Caddy"
