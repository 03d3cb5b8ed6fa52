"""The demo's verdict on the online service: a count of late requests, which two requests
stalled by the host move by two, not a p99 of 100 requests, which they move past the goal."""

from sharegpu.demo import _late


def test_late_counts_the_requests_over_the_limit() -> None:
    service = {"lat_us_all": "4040,4100,4900,16200,12100"}
    assert _late(service, limit_us=4848) == 3
    assert _late(service, limit_us=20000) == 0
