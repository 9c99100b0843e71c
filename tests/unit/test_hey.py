"""hey's summary read into the serving bench's figures (infra/hey.py), and its build's error."""

from __future__ import annotations

import pytest

from infra import hey

# hey v0.1.4's default summary (tabs as hey prints them), written by hand: 46,000 200s, 20 401s
# and 4 transport errors in 15.0213 s
SAMPLE = """
Summary:
  Total:\t15.0213 secs
  Slowest:\t0.2113 secs
  Fastest:\t0.0011 secs
  Average:\t0.0104 secs
  Requests/sec:\t3063.9159
\x20\x20
  Total data:\t98716000 bytes
  Size/request:\t2146 bytes

Response time histogram:
  0.001 [1]\t|
  0.022 [44810]\t|\u25a0\u25a0\u25a0\u25a0\u25a0\u25a0\u25a0\u25a0\u25a0\u25a0\u25a0\u25a0
  0.211 [12]\t|


Latency distribution:
  10% in 0.0040 secs
  25% in 0.0061 secs
  50% in 0.0089 secs
  75% in 0.0123 secs
  90% in 0.0170 secs
  95% in 0.0211 secs
  99% in 0.0412 secs

Details (average, fastest, slowest):
  DNS+dialup:\t0.0000 secs, 0.0011 secs, 0.2113 secs
  DNS-lookup:\t0.0000 secs, 0.0000 secs, 0.0000 secs
  req write:\t0.0000 secs, 0.0000 secs, 0.0006 secs
  resp wait:\t0.0101 secs, 0.0010 secs, 0.2100 secs
  resp read:\t0.0002 secs, 0.0000 secs, 0.0031 secs

Status code distribution:
  [200]\t46000 responses
  [401]\t20 responses

Error distribution:
  [4]\tGet "http://127.0.0.1:8000/v1/timeline?limit=50": context deadline exceeded

"""

# every request failed to connect: no latency, no status (as hey prints it, NaN averages and all)
ALL_ERRORS = """
Summary:
  Total:\t0.0004 secs
  Slowest:\t0.0000 secs
  Fastest:\t0.0000 secs
  Average:\t NaN secs
  Requests/sec:\t7586.4859
\x20\x20

Response time histogram:


Latency distribution:

Details (average, fastest, slowest):
  DNS+dialup:\t NaN secs, 0.0000 secs, 0.0000 secs

Status code distribution:

Error distribution:
  [3]\tGet "http://127.0.0.1:18932/": dial tcp 127.0.0.1:18932: connect: connection refused

"""


def test_reads_per_s_count_the_2xx_over_hey_s_total_time():
    out = hey.parse_summary(SAMPLE)
    assert out["seconds"] == 15.02
    assert out["ok"] == 46_000
    assert out["requests"] == 46_024  # 46,000 + 20 + 4
    assert out["failures"] == 24  # the 401s and the transport errors
    # 46,000 / 15.0213 = 3,062.3 (15.0213 x 3,062 = 45,995.2; the 4.8 left / 15.0213 = 0.3); hey's
    # own Requests/sec (3,063.9) counts the failures too
    assert out["reads_per_s"] == 3062.3
    assert out["p50_ms"] == 8.9
    assert out["p99_ms"] == 41.2
    assert out["status_codes"] == {"200": 46_000, "401": 20}
    assert out["errors"] == {'Get "http://127.0.0.1:8000/v1/timeline?limit=50": context deadline exceeded': 4}


def test_a_run_with_only_errors_has_no_reads_and_no_percentiles():
    out = hey.parse_summary(ALL_ERRORS)
    assert out["ok"] == 0 and out["reads_per_s"] == 0.0
    assert out["requests"] == out["failures"] == 3
    assert out["p50_ms"] is None and out["p99_ms"] is None
    assert out["status_codes"] == {}


def test_output_without_a_summary_is_an_error():
    with pytest.raises(hey.HeyError, match="no summary"):
        hey.parse_summary("flag provided but not defined: -zz\nUsage: hey [options...] <url>\n")


def test_without_go_the_build_fails_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(hey.shutil, "which", lambda name: None)
    with pytest.raises(hey.HeyError) as exc:
        hey.require_hey(tmp_path)
    assert "`go` not found on PATH" in str(exc.value) and "\n" not in str(exc.value)
