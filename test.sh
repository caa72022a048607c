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
#    runs this, a Redis test fails rather than skips without it),
# 4. builds Caddy with the plugin the way operators do (xcaddy) and checks that
#    the module is in it.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")"

CADDY_VERSION=v2.11.9
# xcaddy is run at this version, not required by go.mod: a requirement of the
# module would be one of every operator's build too.
XCADDY_VERSION=v0.4.5
GOLANGCI_LINT_VERSION=v2.15.0
MODULE=github.com/rolter/caddy-ratelimit
MODULE_ID=http.handlers.rolter_ratelimit

section() { printf '\n==== %s ====\n' "$*"; }
die() { printf 'test.sh: FAIL: %s\n' "$*" >&2; exit 1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/rolter-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Packages are installed only as root; anyone else is told what to install.
apt_install() {
	if [[ $(id -u) -ne 0 ]]; then
		die "missing packages: install them (apt-get install $*), or run this as root"
	fi
	apt-get update
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"
}

section "Prerequisites"
command -v go >/dev/null || die "go is not on PATH"
go version
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-cli >/dev/null || missing+=(redis-tools)
# go test -race needs cgo, hence a C compiler.
command -v gcc >/dev/null || missing+=(gcc libc6-dev)
if ((${#missing[@]})); then
	echo "installing: ${missing[*]}"
	apt_install "${missing[@]}"
fi
redis-server --version
# The providers' SDKs read the gateway's refusals in sdk_test.go.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
	echo "installing: nodejs npm"
	apt_install nodejs npm
fi
node --version
# npm ci (about 100 MB) only when node_modules is not what the lock file
# names: the lock file's digest is kept beside what it installed.
lock_sum=$(sha256sum testdata/sdk/package-lock.json | cut -d' ' -f1)
stamp=testdata/sdk/node_modules/.installed-lock-sha256
if [[ $(cat "$stamp" 2>/dev/null) != "$lock_sum" ]]; then
	npm ci --prefix testdata/sdk --no-audit --no-fund --ignore-scripts --loglevel=error
	echo "$lock_sum" >"$stamp"
else
	echo "testdata/sdk/node_modules matches package-lock.json"
fi

section "go vet ./..."
# With -race, vet compiles the dependencies as go test -race does, and
# golangci-lint then reads them too: a new machine compiles them once, not
# twice.
go vet -race ./...

section "golangci-lint $GOLANGCI_LINT_VERSION"
lint="$(go env GOPATH)/bin/golangci-lint"
if ! "$lint" version 2>/dev/null | grep -q "version ${GOLANGCI_LINT_VERSION#v} "; then
	echo "installing golangci-lint $GOLANGCI_LINT_VERSION (a few minutes on a new machine)"
	go install "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$GOLANGCI_LINT_VERSION"
fi
# golangci-lint reads the dependencies' compiled export data: with -race, vet's.
GOFLAGS="${GOFLAGS:+$GOFLAGS }-race" "$lint" run ./...

section "go test -race -count=1 ./... $*"
go build -o "$tmp/withredis" ./internal/redistest/cmd/withredis
"$tmp/withredis" go test -race -count=1 ./... "$@"

section "xcaddy build $CADDY_VERSION --with $MODULE"
go run "github.com/caddyserver/xcaddy/cmd/xcaddy@$XCADDY_VERSION" \
	build "$CADDY_VERSION" --with "$MODULE@v0.0.0=." --output "$tmp/caddy"
modules=$("$tmp/caddy" list-modules) || die "caddy list-modules failed"
if ! grep -Fxq "$MODULE_ID" <<<"$modules"; then
	die "$MODULE_ID is not among the modules of the xcaddy-built Caddy"
fi
echo "ok: $MODULE_ID is in the xcaddy-built Caddy"

section "All tests passed"
