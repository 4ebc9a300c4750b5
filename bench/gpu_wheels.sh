#!/usr/bin/env bash
# The wheels a lent GPU machine's image lacks for gpufleet (it has torch, numpy, pytest, psutil,
# pyyaml, requests, prometheus-client, nvidia-ml-py; nothing can be fetched there), for its Python
# 3.12 on x86-64, into DIR (default .whl, which .git/info/exclude should ignore). Then, there:
#
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site DIR/*.whl
#   PYTHONPATH=/tmp/site:$PWD bash bench/gpu_check.sh OUTDIR
#
# Packages the image already has are removed after the download, so that the image's own stay in use.
set -eu
dir=${1:-.whl}
mkdir -p "$dir"
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_34_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d "$dir" 'grpcio>=1.85.1,<2' 'protobuf>=7.35.1,<8' msgspec 'psycopg[binary]>=3.2' kubernetes redfish \
    cryptography bcrypt trustme
for have in aiohttp- aiohappyeyeballs- aiosignal- attrs- frozenlist- multidict- propcache- yarl- certifi- \
    charset_normalizer- idna- requests-2 urllib3- pyyaml- typing_extensions- python_dateutil- backports_zstd-; do
    rm -f "$dir/$have"*.whl
done
ls "$dir" | wc -l
du -sh "$dir"
