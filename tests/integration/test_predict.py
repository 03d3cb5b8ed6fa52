"""The online-request prediction (native/shim/predict.c) as a pure function of the arbiter
region and the time: driven through native/shim/tests/predict_test.c with a fake clock, no
processes, no GPU.  Times are microseconds; the service's beat is 20 ms."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from cbuild import SHIM_DIR, gcc

PERIOD = 20_000
START = 1_000_000


@pytest.fixture(scope="module")
def predictor(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("predict")
    return gcc(tmp, "predict_test", str(SHIM_DIR / "tests" / "predict_test.c"), str(SHIM_DIR / "predict.c"))


class Run:
    """Commands to the predictor, answered line by line (key=value pairs)."""

    def __init__(self, exe: Path) -> None:
        self.exe = exe
        self.commands: list[str] = []

    def arrive(self, *instants: int) -> Run:
        self.commands += [f"arrive {t}" for t in instants]
        return self

    def end(self, t: int) -> Run:
        self.commands.append(f"end {t}")
        return self

    def next(self, t: int, kernel: int) -> Run:
        self.commands.append(f"next {t} {kernel}")
        return self

    def hold(self, t: int, until: int) -> Run:
        self.commands.append(f"hold {t} {until}")
        return self

    def estimate(self, est: int, measured: int) -> Run:
        self.commands.append(f"estimate {est} {measured}")
        return self

    def answers(self) -> list[dict[str, int]]:
        out = subprocess.run(
            [str(self.exe)], input="\n".join(self.commands), capture_output=True, text=True, check=True
        ).stdout
        return [{k: int(v) for k, v in (kv.split("=") for kv in line.split())} for line in out.splitlines()]


def beat(i: int) -> int:
    return START + i * PERIOD


def test_a_steady_beat_is_predicted_after_two_consistent_intervals(predictor: Path) -> None:
    got = Run(predictor).arrive(beat(0), beat(1)).next(beat(2) - 1_500, 2_000).arrive(beat(2))
    got = got.next(beat(3) - 1_500, 2_000).answers()
    assert got[2]["next"] == 0  # one interval: not trusted yet
    assert got[3]["period"] == PERIOD
    assert got[3]["samples"] == 2
    assert got[4]["next"] == beat(3)
    # Work that ends before the request is due is not held back.
    assert Run(predictor).arrive(*map(beat, range(3))).next(beat(3) - 5_000, 2_000).answers()[-1]["next"] == 0


def test_a_stalled_service_is_predicted_again_at_its_first_request_back_on_the_beat(predictor: Path) -> None:
    """A host stall: four requests late, by less each time (a service on absolute deadlines
    catching up: even intervals of 18 ms, which look like a new pattern), then the old beat
    again.  The beat was not thrown away: the periodic bench's bad runs had restarted learning
    here, and the requests after the stall found the offline job holding the card."""
    delays = [9_000, 7_000, 5_000, 3_000]  # each more than an eighth of the period
    run = Run(predictor).arrive(*map(beat, range(5)))
    run.arrive(*(beat(5 + i) + d for i, d in enumerate(delays)))
    run.next(beat(9) - 1_500, 2_000)  # during the stall: no hold-back for requests that come late
    run.arrive(beat(9)).next(beat(10) - 1_500, 2_000)
    got = run.answers()
    assert got[4]["samples"] >= 2
    stall = got[5:9]
    assert [a["period"] for a in stall] == [PERIOD] * 4, "the learned period survives the stall"
    assert [a["anchor"] for a in stall] == [beat(4)] * 4, "and so does its phase"
    assert stall[-1]["outliers"] == 4
    assert got[9]["next"] == 0
    back = got[10]
    assert back["period"] == PERIOD
    assert back["outliers"] == 0
    assert back["anchor"] == beat(9)
    assert back["stalls"] == 1
    assert back["relearns"] == 0
    assert got[11]["next"] == beat(10)


def test_a_changed_period_is_learned_from_five_requests_on_the_new_beat(predictor: Path) -> None:
    """15 ms requests against a 20 ms beat: every fourth falls on the old beat, and still counts
    for the new pattern."""
    new = 15_000
    changed = [beat(4) + new * i for i in range(1, 6)]
    run = Run(predictor).arrive(*map(beat, range(5))).arrive(*changed).next(changed[-1] + new - 1_500, 2_000)
    got = run.answers()
    assert [a["period"] for a in got[5:9]] == [PERIOD] * 4, "not before four consistent intervals"
    assert abs(got[9]["period"] - new) <= new // 16
    assert got[9]["samples"] >= 2
    assert got[9]["outliers"] == 0
    assert got[9]["relearns"] == 1
    assert got[10]["next"] == changed[-1] + new


def test_a_shifted_phase_is_learned_from_five_requests_on_the_new_phase(predictor: Path) -> None:
    shift = 7_000
    shifted = [beat(i) + shift for i in range(5, 10)]
    run = (
        Run(predictor).arrive(*map(beat, range(5))).arrive(*shifted).next(shifted[-1] + PERIOD - 1_500, 2_000)
    )
    got = run.answers()
    assert got[9]["period"] == PERIOD
    assert got[9]["anchor"] == shifted[-1]
    assert got[9]["relearns"] == 1
    assert got[10]["next"] == shifted[-1] + PERIOD


def test_a_burst_of_catch_up_requests_is_not_a_new_pattern(predictor: Path) -> None:
    """After a long stall, requests at 1 ms intervals (every deadline passed): even intervals,
    but not for two periods; the beat comes back and is predicted at once."""
    burst = [beat(7) + 4_000 + 1_000 * i for i in range(6)]
    run = Run(predictor).arrive(*map(beat, range(5))).arrive(*burst).arrive(beat(8))
    run.next(beat(9) - 1_500, 2_000)
    got = run.answers()
    assert got[10]["outliers"] == 6
    assert got[10]["period"] == PERIOD
    assert got[11]["period"] == PERIOD
    assert got[11]["outliers"] == 0
    assert got[11]["relearns"] == 0
    assert got[12]["next"] == beat(9)


def test_a_service_that_slowed_down_more_than_eightfold_is_learned(predictor: Path) -> None:
    slow = 200_000
    slowed = [beat(4) + slow * i for i in range(1, 6)]
    run = Run(predictor).arrive(*map(beat, range(5))).arrive(*slowed).next(slowed[-1] + slow - 1_500, 2_000)
    got = run.answers()
    assert got[9]["period"] == slow
    assert got[9]["relearns"] == 1
    assert got[10]["next"] == slowed[-1] + slow


def test_two_missed_hold_backs_suspend_the_prediction_until_the_beat_returns(predictor: Path) -> None:
    run = Run(predictor).arrive(*map(beat, range(5)))
    run.hold(beat(5) - 200, beat(5) + 300).hold(beat(6) - 200, beat(6) + 300)  # nobody came
    run.hold(beat(7) - 200, beat(7) + 300)  # the second miss: no more hold-backs
    run.next(beat(8) - 1_500, 2_000)
    run.arrive(beat(8)).next(beat(9) - 1_500, 2_000)
    got = run.answers()
    assert [h["allowed"] for h in got[5:8]] == [1, 1, 0]
    assert got[7]["misses"] == 2
    assert got[8]["next"] == 0
    assert got[9]["outliers"] == 0
    assert got[9]["period"] == PERIOD
    assert got[10]["next"] == beat(9)


def test_a_stray_request_between_beats_changes_nothing(predictor: Path) -> None:
    run = Run(predictor).arrive(*map(beat, range(5))).arrive(beat(4) + 9_000, beat(5))
    run.next(beat(6) - 1_500, 2_000)
    got = run.answers()
    assert got[6]["period"] == PERIOD
    assert got[6]["outliers"] == 0
    assert got[6]["anchor"] == beat(5)
    assert got[7]["next"] == beat(6)


def test_a_suspended_prediction_resumes_only_close_to_the_beat(predictor: Path) -> None:
    """Random traffic falls within an eighth of some multiple of the period one time in four;
    resuming on such a request held offline work back for nothing.  Resuming takes a request
    within a 32nd of the period (or four jitters)."""
    run = Run(predictor).arrive(*map(beat, range(5))).arrive(beat(5) + 9_000, beat(6) + 8_000)
    run.arrive(beat(7) + 2_000).next(beat(8) - 1_500, 2_000)  # a tenth off: within an eighth
    run.arrive(beat(8) + 300).next(beat(9) - 1_500, 2_000)  # on the beat
    got = run.answers()
    assert got[6]["outliers"] == 2
    assert got[7]["outliers"] == 3
    assert got[8]["next"] == 0
    assert got[9]["outliers"] == 0
    assert got[9]["stalls"] == 1
    assert abs(got[10]["next"] - beat(9)) <= 200  # the phase moved a quarter of 300 µs


def estimates(predictor: Path, measured: list[int]) -> list[int]:
    """The offline kernel estimate after each bound sync of `measured` µs, from none."""
    est, out = 0, []
    for m in measured:
        est = Run(predictor).estimate(est, m).answers()[0]["estimate"]
        out.append(est)
    return out


def test_the_kernel_estimate_is_a_decaying_maximum(predictor: Path) -> None:
    got = estimates(predictor, [2_000, 2_000, 1_000, 1_000, 1_000, 2_100])
    assert got[:2] == [2_000, 2_000]
    assert got[2:5] == [1_750, 1_531, 1_339]  # an eighth off per sync, never below a measurement
    assert got[5] == 2_100


def test_one_stalled_sync_does_not_switch_the_prediction_off(predictor: Path) -> None:
    """A sync the host stalled for 14 ms (the bench's bad run) makes the estimate at most twice
    the kernel, which still leaves the 2 ms kernels a prediction; taken whole it left none."""
    got = estimates(predictor, [2_000, 2_000, 14_000, 2_000])
    assert got[2] == 4_000
    assert got[3] == 3_500
    run = Run(predictor).arrive(beat(0), beat(1), beat(2))
    answers = run.next(beat(3) - 3_000, got[2]).next(beat(3) - 3_000, 14_000).answers()
    assert answers[3]["next"] == beat(3)  # 4 ms of work 3 ms before the beat: held back
    assert answers[4]["next"] == 0  # 14 ms, more than half the period: no prediction at all
    assert answers[4]["launch_by"] == 0


def test_kernels_that_really_got_longer_are_followed_within_a_few_syncs(predictor: Path) -> None:
    assert estimates(predictor, [500, 8_000, 8_000, 8_000, 8_000]) == [500, 1_000, 2_000, 4_000, 8_000]


def test_an_overdue_request_is_waited_for_one_more_offline_kernel(predictor: Path) -> None:
    """A request whose timer fires 1 ms late (the periodic repeats' queued requests were late by
    0.9-2.3 ms) still finds the card held back for it: the hold-back lasts 300 µs plus one
    offline kernel past the instant, so no 2 ms kernel starts just before it."""
    steady = Run(predictor).arrive(beat(0), beat(1), beat(2))
    answers = steady.next(beat(3) + 1_000, 2_000).next(beat(3) + 2_400, 2_000).answers()
    assert (answers[3]["next"], answers[3]["late"]) == (beat(3), 2_300)
    assert answers[4]["next"] == 0  # past that: the next beat's, far enough to launch
    assert answers[4]["launch_by"] == beat(4) - 2_100


def test_the_wait_for_an_overdue_request_is_cut_to_the_room(predictor: Path) -> None:
    """The hold-back may last half the period (10 ms here): 8 ms kernels and the fixed margins
    leave 1.6 ms for the overdue request, kernels of 9.6 ms none, and none goes unpredicted."""
    steady = Run(predictor).arrive(beat(0), beat(1), beat(2))
    answers = steady.next(beat(3) - 8_000, 8_000).next(beat(3) - 9_000, 9_600).answers()
    assert (answers[3]["next"], answers[3]["late"]) == (beat(3), 1_900)
    assert (answers[4]["next"], answers[4]["late"]) == (beat(3), 300)


HOST_TIME = 5_000  # a closed-loop service's host time between the end of a request and the next
REQUEST = 800  # its request's work


def closed_loop(run: Run, waits: list[int], start: int = START) -> list[tuple[int, int]]:
    """A service that waits for each request, then runs its host code: request i asks at a_i,
    waits waits[i] behind offline work, runs REQUEST and ends; the next asks HOST_TIME later.
    Each wait moves every later request, so the requests keep no beat.  (a_i, end_i) each."""
    at, out = start, []
    for wait in waits:
        end = at + wait + REQUEST
        run.arrive(at).end(end)
        out.append((at, end))
        at = end + HOST_TIME
    return out


def test_a_closed_loop_service_is_predicted_from_its_host_time(predictor: Path) -> None:
    """Beside 2 ms offline kernels such a service learned no beat (each request waited 0-2 ms for
    the kernel in flight) and every request waited: predicted from its host time after each
    request's end, the next request finds the card held back for it."""
    run = Run(predictor)
    requests = closed_loop(run, [0, 1_500, 300, 1_900, 700])
    _, last_end = requests[-1]
    run.next(last_end + HOST_TIME - 1_500, 2_000).next(last_end + 100, 2_000)
    got = run.answers()
    learned = got[8]  # the fifth arrival
    assert learned["samples"] < 2  # no beat: intervals of 5.8-7.7 ms
    assert (learned["gap"], learned["gap_samples"]) == (HOST_TIME, 4)
    assert got[10]["next"] == last_end + HOST_TIME
    assert got[11]["next"] == 0  # far enough: launch, but not after launch_by
    assert got[11]["launch_by"] == last_end + HOST_TIME - 2_000 - 100


def test_the_host_time_is_not_used_while_the_request_runs_or_once_it_is_overdue(predictor: Path) -> None:
    run = Run(predictor)
    end = closed_loop(run, [0, 1_500, 300])[-1][1]
    run.arrive(end + HOST_TIME).next(end + HOST_TIME + 200, 2_000)  # the next request runs: no end yet
    run.end(end + HOST_TIME + REQUEST)
    overdue = end + 2 * HOST_TIME + REQUEST
    run.next(overdue + 300 + 2_000 + 1, 2_000)  # past the wait for it: a late or missing request
    got = run.answers()
    assert got[7]["next"] == 0
    assert got[7]["launch_by"] == 0
    assert got[9]["next"] == 0


def test_a_periodic_service_whose_requests_wait_is_predicted_by_its_beat(predictor: Path) -> None:
    """An open-loop service (requests on a timer) whose requests wait for different times: the
    gaps after their ends vary with the waits (within an eighth of 20 ms, so they are learned
    too), and the beat, which does not, predicts."""
    run = Run(predictor)
    for i, wait in enumerate([0, 1_500, 300, 1_900, 700]):
        run.arrive(beat(i)).end(beat(i) + wait + REQUEST)
    run.next(beat(5) - 1_500, 2_000)
    got = run.answers()
    assert got[8]["samples"] >= 2
    end = beat(4) + 700 + REQUEST
    assert end + got[8]["gap"] != beat(5)  # the host time would say otherwise
    assert got[10]["next"] == beat(5)


def test_two_missed_hold_backs_suspend_the_host_time_prediction(predictor: Path) -> None:
    run = Run(predictor)
    end = closed_loop(run, [0, 1_500, 300, 1_900])[-1][1]
    nxt = end + HOST_TIME
    run.hold(nxt - 200, nxt + 300).hold(nxt + 400, nxt + 800).hold(nxt + 900, nxt + 1_200)
    run.next(nxt + 1_000, 2_000)
    got = run.answers()
    assert [h["allowed"] for h in got[8:11]] == [1, 1, 0]
    assert got[11]["next"] == 0
