#!/usr/bin/env bash
# Every file a README link or a `path/...` in the README names must exist; every `make` target
# it names must exist. (The commands themselves run in e2e and `make demo`.)
set -euo pipefail
cd "$(dirname "$0")/.."
bad=0
while read -r p; do [ -e "$p" ] || { echo "README links to a missing file: $p"; bad=1; }; done < <(
  grep -oE '\]\(([^)#]+)\)' README.md | sed 's/](\(.*\))/\1/' | grep -v '^http' | sort -u)
while read -r p; do [ -e "$p" ] || { echo "README names a missing path: $p"; bad=1; }; done < <(
  grep -oE '`(e2e|scripts|bench|charts|crds|docs|examples|proxy|operator|config)/[^` ]*`' README.md | tr -d '`' | sed 's/[.,;:]$//' | sort -u)
while read -r t; do grep -q "^$t:" Makefile || { echo "README names a missing make target: $t"; bad=1; }; done < <(
  grep -oE 'make [a-z-]+' README.md | awk '{print $2}' | sort -u)
exit $bad
