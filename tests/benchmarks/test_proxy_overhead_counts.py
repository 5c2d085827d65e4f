"""benchmarks/proxy_overhead/counts.py reads strace's and perf's summaries into counts."""

from __future__ import annotations

from benchmarks.proxy_overhead.counts import perf_count, strace_calls

STRACE = """\
% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 45.10    0.021000           3      6512           write
 30.00    0.014000           1     12488           getpid
 20.00    0.009000           2      4700       212 read
  4.90    0.002000           1      4290           epoll_pwait
------ ----------- ----------- --------- --------- ----------------
100.00    0.046000           1     27990       212 total
"""


def test_strace_summary_gives_calls_by_syscall_without_the_total() -> None:
    assert strace_calls(STRACE) == {"write": 6512, "getpid": 12488, "read": 4700,
                                    "epoll_pwait": 4290}
    assert strace_calls("strace: Process 1 attached\n") == {}


def test_perf_stat_csv_gives_the_event_count_or_none() -> None:
    output = ("# started on Sun Nov 29 09:06:44 2026\n\n"
              "1038361,,probe_libpython3:PyObject_Malloc,1038361,100.00,,\n")
    assert perf_count(output, "probe_libpython3:PyObject_Malloc") == 1038361
    assert perf_count(output, "probe_libpython3:PyObject_Free") is None
    assert perf_count("<not counted>,,probe_libpython3:PyObject_Malloc,0,0.00,,\n",
                      "probe_libpython3:PyObject_Malloc") is None
