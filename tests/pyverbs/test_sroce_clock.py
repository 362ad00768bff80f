# SPDX-License-Identifier: MIT
"""The device clock, in rdma-core's own test harness.

rdma-core's test_mlx5_timestamp converts clock ticks to nanoseconds with
mlx5dv (Mlx5Context.device_timestamp_to_ns), which only an mlx5 device
offers, so on any other device it skips.  These are the same tests with the
conversion every program can make: ticks * 10^6 / hca_core_clock (kHz).  And
stricter: each value must fall between readings of the host's clocks taken
around it, not merely be a valid date.

test_rdma_core_suite.sh copies this file into its copy of the suite, whose
tests.base and tests.utils it uses, so it runs with the suite's device
arguments and is judged with its other tests.
"""
import errno
import time
import unittest

from pyverbs.cq import CQEX, CqInitAttrEx, PollCqAttr
from pyverbs.enums import IBV_WC_EX_WITH_COMPLETION_TIMESTAMP as FREE_RUNNING, \
    IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK as REAL_TIME
from pyverbs.pyverbs_error import PyverbsRDMAError
from pyverbs.qp import QPInitAttr
import pyverbs.enums as e

from tests.base import RCResources, RDMATestCase, PyverbsAPITestCase
import tests.utils as u


def ticks_to_ns(ctx, ticks):
    """Clock ticks to nanoseconds with the device's hca_core_clock (kHz)."""
    khz = ctx.query_device_ex().hca_core_clock
    if khz == 0:
        raise unittest.SkipTest('The device reports no core clock')
    return ticks * 1000000 // khz


class ClockRes(RCResources):
    """RC resources whose CQs are extended ones with the given wc_flags."""

    def __init__(self, dev_name, ib_port, gid_index, ts_flags):
        self.ts_flags = ts_flags
        self.scq = self.rcq = None
        super().__init__(dev_name=dev_name, ib_port=ib_port, gid_index=gid_index)

    def create_cq(self):
        cia = CqInitAttrEx(cqe=self.num_msgs, wc_flags=e.IBV_WC_STANDARD_FLAGS | self.ts_flags)
        try:
            self.scq = CQEX(self.ctx, cia)
            self.rcq = CQEX(self.ctx, cia)
        except PyverbsRDMAError as ex:
            if ex.error_code == errno.EOPNOTSUPP:
                raise unittest.SkipTest('Create Extended CQ is not supported')
            raise ex

    def create_qp_init_attr(self):
        return QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.scq, rcq=self.rcq,
                          cap=self.create_qp_cap())


def poll_one(cqex, ts_flags):
    """(ticks, wallclock ns) of the next successful completion of cqex, each
    None unless ts_flags asks for it."""
    attr = PollCqAttr()
    deadline = time.monotonic() + 10
    ret = cqex.start_poll(attr)
    while ret == errno.ENOENT and time.monotonic() < deadline:
        ret = cqex.start_poll(attr)
    if ret != 0:
        raise PyverbsRDMAError(f'No completion (start_poll returned {ret})')
    try:
        if cqex.status != e.IBV_WC_SUCCESS:
            raise PyverbsRDMAError(f'Completion status {cqex.status}')
        ticks = cqex.read_timestamp() if ts_flags & FREE_RUNNING else None
        wall = cqex.read_completion_wallclock_ns() if ts_flags & REAL_TIME else None
        return ticks, wall
    finally:
        cqex.end_poll()


class ClockTrafficTest(RDMATestCase):
    """Completion timestamps of RC traffic: one SEND, both ends' completions."""

    def traffic(self, ts_flags):
        self.client = ClockRes(**self.dev_info, ts_flags=ts_flags)
        self.server = ClockRes(**self.dev_info, ts_flags=ts_flags)
        self.client.pre_run(self.server.psns, self.server.qps_num)
        self.server.pre_run(self.client.psns, self.client.qps_num)
        u.post_recv(self.server, u.get_recv_wr(self.server))
        send_wr, _ = u.get_send_elements(self.client, False)
        mono0, wall0 = time.monotonic_ns(), time.time_ns()
        u.send(self.client, send_wr, e.IBV_WR_SEND, False, 0)
        sent = poll_one(self.client.scq, ts_flags)
        received = poll_one(self.server.rcq, ts_flags)
        return mono0, wall0, time.monotonic_ns(), time.time_ns(), sent, received

    def test_free_running_rc_traffic(self):
        mono0, _, mono1, _, sent, received = self.traffic(FREE_RUNNING)
        for name, (ticks, _) in (('send', sent), ('receive', received)):
            ns = ticks_to_ns(self.client.ctx, ticks)
            self.assertTrue(mono0 <= ns <= mono1,
                            f'{name} completion at {ns} ns, outside [{mono0}, {mono1}] '
                            'of CLOCK_MONOTONIC')

    def test_real_time_rc_traffic(self):
        _, wall0, _, wall1, sent, received = self.traffic(REAL_TIME)
        for name, (_, wall) in (('send', sent), ('receive', received)):
            self.assertTrue(wall0 <= wall <= wall1,
                            f'{name} completion at {wall} ns, outside [{wall0}, {wall1}] '
                            'of CLOCK_REALTIME')

    def test_both_clocks_one_instant(self):
        """Both timestamps of one completion are the same moment on two clocks."""
        mono0, wall0, mono1, wall1, sent, received = self.traffic(FREE_RUNNING | REAL_TIME)
        # REALTIME - MONOTONIC, known to within the time the readings took.
        offset_lo, offset_hi = wall0 - mono1, wall1 - mono0
        for name, (ticks, wall) in (('send', sent), ('receive', received)):
            offset = wall - ticks_to_ns(self.client.ctx, ticks)
            self.assertTrue(offset_lo <= offset <= offset_hi,
                            f'{name} completion: wallclock - timestamp {offset} ns, '
                            f'outside [{offset_lo}, {offset_hi}]')


class ClockApiTest(PyverbsAPITestCase):
    def test_query_rt_values(self):
        """ibv_query_rt_values_ex's raw clock, converted, is CLOCK_MONOTONIC's."""
        before = time.monotonic_ns()
        try:
            _, ticks = self.ctx.query_rt_values_ex()
        except PyverbsRDMAError as ex:
            if ex.error_code == errno.EOPNOTSUPP:
                raise unittest.SkipTest('Query device real time is not supported')
            raise ex
        after = time.monotonic_ns()
        ns = ticks_to_ns(self.ctx, ticks)
        self.assertTrue(before <= ns <= after,
                        f'raw clock {ns} ns outside [{before}, {after}] of CLOCK_MONOTONIC')

    def test_hca_core_clock(self):
        attr = self.ctx.query_device_ex()
        self.assertGreater(attr.hca_core_clock, 0)
        self.assertNotEqual(attr.completion_timestamp_mask, 0)
