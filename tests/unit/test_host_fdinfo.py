"""One DRM client from its fdinfo text, as i915 and xe print it (the kernel docs' examples),
as older kernels and other drivers print it, and garbled; and engine use between two
readings."""

from __future__ import annotations

import pytest

from gas.host.fdinfo import DrmClient, Engine, parse_fdinfo, utilization
from tests.support.fakeproc import KIB, MIB, i915_fdinfo, kernel_size, xe_fdinfo

# The i915 page's example (Documentation/gpu/i915.rst, "DRM client usage stats
# implementation"), an integrated card's client, with its memory lines as 6.8 prints them.
I915_DOCS = """\
pos:    0
flags:  0100002
mnt_id: 21
drm-driver: i915
drm-pdev:   0000:00:02.0
drm-client-id:      7
drm-total-system0:      6044 KiB
drm-shared-system0:     0
drm-active-system0:     0
drm-resident-system0:   6044 KiB
drm-purgeable-system0:  1688 KiB
drm-total-stolen-system0:       0
drm-shared-stolen-system0:      0
drm-active-stolen-system0:      0
drm-resident-stolen-system0:    0
drm-purgeable-stolen-system0:   0
drm-engine-render:  9288864723 ns
drm-engine-copy:    2035071108 ns
drm-engine-video:   0 ns
drm-engine-capacity-video:   2
drm-engine-video-enhance:   0 ns
"""

# The xe page's example (Documentation/gpu/xe/xe-drm-usage-stats.rst), a discrete card's.
XE_DOCS = """\
pos:    0
flags:  0100002
mnt_id: 26
ino:    685
drm-driver:     xe
drm-client-id:  3
drm-pdev:       0000:03:00.0
drm-total-system:       0
drm-shared-system:      0
drm-active-system:      0
drm-resident-system:    0
drm-purgeable-system:   0
drm-total-gtt:  192 KiB
drm-shared-gtt: 0
drm-active-gtt: 0
drm-resident-gtt:       192 KiB
drm-total-vram0:        23992 KiB
drm-shared-vram0:       16 MiB
drm-active-vram0:       0
drm-resident-vram0:     23992 KiB
drm-total-stolen:       0
drm-shared-stolen:      0
drm-active-stolen:      0
drm-resident-stolen:    0
drm-cycles-rcs: 28257900
drm-total-cycles-rcs:   7655183225
drm-cycles-bcs: 0
drm-total-cycles-bcs:   7655183225
drm-cycles-vcs: 0
drm-total-cycles-vcs:   7655183225
drm-engine-capacity-vcs:        2
drm-cycles-vecs:        0
drm-total-cycles-vecs:  7655183225
drm-engine-capacity-vecs:       2
drm-cycles-ccs: 0
drm-total-cycles-ccs:   7655183225
drm-engine-capacity-ccs:        4
"""


def parsed(text: str) -> DrmClient:
    client = parse_fdinfo(text)
    assert client is not None
    return client


# ---------------------------------------------------------------- the drivers' own examples


def test_i915_docs_example() -> None:
    client = parsed(I915_DOCS)
    assert (client.driver, client.pdev, client.client_id) == ("i915", "0000:00:02.0", "7")
    assert client.key == ("0000:00:02.0", "7")
    assert client.total == {"system0": 6044 * KIB, "stolen-system0": 0}
    assert client.resident == {"system0": 6044 * KIB, "stolen-system0": 0}
    # i915's busy times carry their unit: they are read, not refused as garbled.
    assert client.engines == {
        "render": Engine(9288864723),
        "copy": Engine(2035071108),
        "video": Engine(0, None, 2),
        "video-enhance": Engine(0),
    }
    assert client.problems == ()
    # An integrated card has no local memory: its clients' memory is in system memory.
    assert client.reports_memory
    assert client.device_memory() == 6044 * KIB


def test_xe_docs_example() -> None:
    client = parsed(XE_DOCS)
    assert (client.driver, client.pdev, client.client_id) == ("xe", "0000:03:00.0", "3")
    assert client.total == {"system": 0, "gtt": 192 * KIB, "vram0": 23992 * KIB, "stolen": 0}
    assert client.resident["vram0"] == 23992 * KIB
    total = 7655183225
    assert client.engines == {
        "rcs": Engine(28257900, total, 1),
        "bcs": Engine(0, total, 1),
        "vcs": Engine(0, total, 2),
        "vecs": Engine(0, total, 2),
        "ccs": Engine(0, total, 4),
    }
    assert client.problems == ()
    # A discrete card: its own memory only (not the 192 KiB of gtt).
    assert client.device_memory() == 23992 * KIB


def test_the_fake_trees_texts_read_as_the_docs_examples_do() -> None:
    assert parsed(i915_fdinfo(7, "0000:00:02.0")).engines == parsed(I915_DOCS).engines
    assert parsed(i915_fdinfo(7, "0000:00:02.0")).total == parsed(I915_DOCS).total
    fake = parsed(xe_fdinfo(3, "0000:03:00.0"))
    docs = parsed(XE_DOCS)
    assert (fake.total, fake.resident, fake.engines) == (docs.total, docs.resident, docs.engines)


@pytest.mark.parametrize(
    ("amount", "text"),
    [
        (0, "0"),
        (1000, "1000"),
        (192 * KIB, "192 KiB"),
        (16 * MIB, "16 MiB"),
        (3 * 1024**3, "3072 MiB"),
    ],
)
def test_sizes_are_printed_as_the_kernel_prints_them(amount: int, text: str) -> None:
    assert kernel_size(amount) == text


def test_a_discrete_i915_client_counts_its_local_memory() -> None:
    client = parsed(i915_fdinfo(9, "0000:03:00.0", local=512 * MIB, system=64 * MIB))
    assert client.total["local0"] == 512 * MIB
    assert client.device_memory() == 512 * MIB


def test_an_integrated_xe_client_counts_system_and_gtt() -> None:
    client = parsed(xe_fdinfo(4, "0000:00:02.0", vram=None, system=4 * MIB, gtt=8 * MIB))
    assert "vram0" not in client.total
    assert client.device_memory() == 12 * MIB


def test_every_local_region_counts() -> None:
    text = "drm-driver: xe\ndrm-total-vram0: 2 MiB\ndrm-total-vram1: 3 MiB\ndrm-total-gtt: 1 GiB\n"
    assert parsed(text).device_memory() == 5 * MIB


# ---------------------------------------------------------------- units, keys, older kernels


@pytest.mark.parametrize(
    ("value", "expected"),
    [("4096", 4096), ("4 KiB", 4096), ("4KiB", 4096), ("3 MiB", 3 * MIB), ("2 GiB", 2 * 1024**3)],
)
def test_memory_units(value: str, expected: int) -> None:
    assert parsed(f"drm-driver: xe\ndrm-total-vram0:\t{value}\n").total == {"vram0": expected}


def test_without_memory_keys_the_kernel_reports_no_memory() -> None:
    client = parsed(i915_fdinfo(7, "0000:03:00.0", memory=False))
    assert client.total == {} and not client.reports_memory
    assert client.device_memory() is None
    assert client.engines["render"] == Engine(9288864723)


def test_legacy_memory_keys_are_the_total() -> None:
    text = (
        "drm-driver: i915\ndrm-client-id: 2\ndrm-memory-local0: 8 MiB\ndrm-memory-system0: 1 MiB\n"
    )
    client = parsed(text)
    assert client.total == {"local0": 8 * MIB, "system0": MIB}
    assert client.device_memory() == 8 * MIB


def test_unknown_drivers_and_keys_are_read_as_far_as_the_format_goes() -> None:
    text = (
        "pos:\t0\n"
        "drm-driver:\tamdgpu\n"
        "drm-pdev:\t0000:0b:00.0\n"
        "drm-client-id:\t12\n"
        "drm-pasid:\t32771\n"
        "drm-memory-vram:\t4096 KiB\n"
        "drm-shared-vram:\t0\n"
        "drm-engine-gfx:\t1000 ns\n"
        "amd-memory-visible-vram:\t0 KiB\n"
        "drm-evicted-visible-vram:\t0 KiB\n"
    )
    client = parsed(text)
    assert client.driver == "amdgpu" and client.key == ("0000:0b:00.0", "12")
    assert client.total == {"vram": 4096 * KIB}
    assert client.engines == {"gfx": Engine(1000)}
    assert client.problems == ()
    # Not an Intel region name: neither local nor system memory.
    assert client.device_memory() == 0


def test_a_file_without_drm_driver_is_no_drm_client() -> None:
    assert parse_fdinfo("pos:\t0\nflags:\t02\nmnt_id:\t15\nino:\t1057\n") is None
    assert parse_fdinfo("pos:\t0\nflags:\t02\neventfd-count:\t0\neventfd-id: 3\n") is None
    assert parse_fdinfo("") is None
    assert parse_fdinfo("drm-driver:\n") is None


def test_a_client_without_id_or_pdev_still_reads() -> None:
    client = parsed("drm-driver: i915\ndrm-engine-render: 5 ns\n")
    assert (client.pdev, client.client_id) == ("", "")
    assert client.engines == {"render": Engine(5)}


def test_keys_with_whitespace_or_not_at_line_start_are_not_keys() -> None:
    text = "drm-driver: i915\ndrm total-local0: 5\n drm-total-local1: 6\ndrm-total-local2 : 7\n"
    assert parsed(text).total == {}


# ---------------------------------------------------------------- garbled values


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("drm-total-vram0: lots", "drm-total-vram0: 'lots' is not a number"),
        ("drm-total-vram0: 5 PiB", "drm-total-vram0: '5 PiB' is not a number"),
        ("drm-total-vram0: -5", "drm-total-vram0: '-5' is not a number"),
        ("drm-resident-vram0: 1.5 MiB", "drm-resident-vram0: '1.5 MiB' is not a number"),
        ("drm-engine-render: 12 ms", "drm-engine-render: '12 ms' is not a number"),
        ("drm-cycles-rcs: 12 KiB", "drm-cycles-rcs: '12 KiB' is not a number"),
        ("drm-total-cycles-rcs:", "drm-total-cycles-rcs: '' is not a number"),
        ("drm-engine-capacity-vcs: two", "drm-engine-capacity-vcs: 'two' is not a number"),
        ("drm-engine-render: ٣ ns", "drm-engine-render: '٣ ns' is not a number"),
    ],
)
def test_a_garbled_value_is_left_out_and_named(line: str, problem: str) -> None:
    client = parsed(f"drm-driver: xe\ndrm-client-id: 1\n{line}\ndrm-total-gtt: 4 KiB\n")
    (said,) = client.problems
    assert said.startswith(problem)
    # The rest of the file is still read.
    assert client.total["gtt"] == 4 * KIB
    assert client.client_id == "1"


# ---------------------------------------------------------------- engine use


def test_i915_utilization_is_busy_time_over_wall_time_and_engines() -> None:
    before, after = Engine(1_000_000_000), Engine(1_500_000_000)
    assert utilization(before, after, 2.0) == pytest.approx(0.25)
    # Two video engines: 1 s busy in 1 s is half the class.
    assert utilization(Engine(0, None, 2), Engine(10**9, None, 2), 1.0) == pytest.approx(0.5)
    # A reading a little late never says more than all of it.
    assert utilization(Engine(0), Engine(3 * 10**9), 2.0) == 1.0


def test_xe_utilization_is_on_the_gpu_clock() -> None:
    before = Engine(28257900, 7655183225, 1)
    after = Engine(28257900 + 500, 7655183225 + 2000, 1)
    # The seconds do not matter: both counts are the GPU's.
    assert utilization(before, after, 10.0) == pytest.approx(0.25)
    assert utilization(Engine(0, 0, 4), Engine(2000, 1000, 4), 1.0) == pytest.approx(0.5)


def test_utilization_cannot_be_told_from_a_counter_gone_back_or_no_time() -> None:
    assert utilization(Engine(500), Engine(100), 1.0) is None  # another client now
    assert utilization(Engine(0), Engine(100), 0.0) is None
    assert utilization(Engine(0, 100), Engine(10, 100), 1.0) is None
