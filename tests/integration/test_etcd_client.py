from sluice.core.etcd import Etcd


def test_put_get_and_restart(etcd):
    """A restarted etcd is used again at once (the library would blacklist it for 5 minutes)."""
    c = Etcd(etcd.endpoint, timeout=2)
    c.put("/t/a", b"1")
    assert c.get("/t/a")[0] == b"1"
    etcd.restart()
    c.wait_ready(10)
    assert c.get("/t/a")[0] == b"1"
