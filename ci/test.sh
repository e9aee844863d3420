#!/usr/bin/env bash
# All of ainftp's checks and tests, on a fresh Debian 12 machine as root:
# host setup, formatting, clippy, then every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup-host.sh

for component in rustfmt clippy; do
    if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
        rustup component add "$component" || { echo "ci: cargo $component missing and rustup cannot add it" >&2; exit 1; }
    fi
done

echo "ci: cargo fmt --check"
cargo fmt --all --check
echo "ci: cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "ci: tests (nextest: one process per test, as DPDK's EAL is once per process)"
cargo nextest run --workspace --no-fail-fast
