"""engine.omp_wait_policy: ``auto`` picks sleeping OpenMP waits when another process keeps a core busy as
the run starts (spinning threads sharing a core with it made steps tens of times slower), and the
workers' environment carries the choice.

``busy_cores`` reads ``/proc/stat`` twice around a sleep; the tests hand it the two readings and a sleep that
only records its argument, so nothing depends on the machine's load or on timing."""

from armor_core.engine import busy_cores, wait_policy


def _stat(busy: int, idle: int, iowait: int = 0) -> str:
    """A ``/proc/stat`` whose ``cpu`` line counts ``busy`` user jiffies and ``idle`` + ``iowait`` idle ones."""
    return f"cpu  {busy} 0 0 {idle} {iowait} 0 0 0 0 0\ncpu0 0 0 0 0 0 0 0 0 0 0\n"


def _readings(*texts: str):
    it = iter(texts)
    return lambda: next(it)


def test_explicit_policies_are_kept():
    never = lambda: 1 / 0  # noqa: E731  an explicit policy never measures
    assert wait_policy("active", busy=never) == "active" and wait_policy("passive", busy=never) == "passive"


def test_busy_cores_is_the_busy_share_of_the_interval_times_the_cores():
    slept = []
    # 100 jiffies pass: 25 busy, 75 idle or iowait; on 4 cores that is one core kept busy
    read = _readings(_stat(1000, 5000, 100), _stat(1025, 5070, 105))
    assert busy_cores(0.3, read_stat=read, sleep=slept.append, cpus=4) == 1.0
    assert slept == [0.3]


def test_busy_cores_is_zero_where_proc_stat_cannot_be_read():
    def missing():
        raise OSError("no /proc")

    assert busy_cores(read_stat=missing, sleep=lambda s: None) == 0.0
    assert busy_cores(read_stat=_readings("cpu", "cpu"), sleep=lambda s: None) == 0.0


def test_auto_chooses_passive_from_half_a_busy_core():
    assert wait_policy("auto", busy=lambda: 0.5) == "passive"
    assert wait_policy("auto", busy=lambda: 0.49) == "active"
    # through busy_cores: a spinning neighbour keeps one of two cores busy
    read = _readings(_stat(0, 0), _stat(50, 50))
    assert wait_policy("auto", busy=lambda: busy_cores(read_stat=read, sleep=lambda s: None, cpus=2)) == "passive"
