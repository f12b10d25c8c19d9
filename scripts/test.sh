#!/usr/bin/env bash
# Every test: installs what the tests need, then lint and the whole pytest suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh test
.venv/bin/ruff check gpuprov tests bench tools
.venv/bin/ruff format --check gpuprov tests bench tools
# pytest exits 5 when it collected nothing: that is a failure here, not a pass.
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
if [[ $rc -eq 5 ]]; then
  echo "test.sh: pytest collected no tests" >&2
  exit 1
fi
exit $rc
