"""What the simulator's tests share: a day of one burst, and the suspend timeout
(their fixture `replays`, the database replays drain, is in tests/conftest.py)."""

TIMEOUT = 5  # minutes: the compute's suspend timeout
BURST = {  # one burst, shorter than an hour so no backstop tick falls in it
    "hours": 0.8, "seed": 1, "failing_share": 0.2,
    "duration": {"median": 0.2, "sigma": 0.5, "max": 5},
    "bursts": [{"at": "00:05", "minutes": 5, "jobs": 60}],
}
