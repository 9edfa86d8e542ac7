#!/usr/bin/env bash
# cargo deny over the workspace (make lint). Installs cargo-deny once from crates.io into the
# cache. licenses, bans and sources always run; advisories need the RustSec database, which is
# fetched from GitHub — unreachable from machines that only reach the package registries — so
# they run only when a database is present (CARGO_DENY_DB, or cargo-deny's default location).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/e2e/lib/versions.sh"
tools=$PROXYFLEET_CACHE/cargo-tools
deny=$tools/bin/cargo-deny
if ! [ -x "$deny" ] || ! "$deny" --version | grep -q "${CARGO_DENY_VERSION}"; then
  echo "installing cargo-deny $CARGO_DENY_VERSION (once, into $tools)" >&2
  cargo install --locked -q cargo-deny --version "$CARGO_DENY_VERSION" --root "$tools"
fi
cd "$root"
"$deny" --manifest-path Cargo.toml --offline check licenses bans sources
db=${CARGO_DENY_DB:-$HOME/.cargo/advisory-dbs}
if compgen -G "$db/*" >/dev/null; then
  "$deny" --manifest-path Cargo.toml --offline check advisories
else
  echo "cargo deny: advisories skipped: no RustSec database at $db (github.com is not reachable here)" >&2
fi
