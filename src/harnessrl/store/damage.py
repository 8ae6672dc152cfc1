"""Reading recorded calls back when a row of them may be damaged.

``store.codecs`` raises rather than guess what a damaged call row held. A reader that trains on, or
shows, one attempt at a time asks for that attempt only (``read_attempt_calls``): a damaged row of an
earlier, retried attempt then costs nothing, and one of the attempt asked for is ``CallsUnreadable``,
naming it, which the reader turns into one rollout left out (the trainer, sft, the controller) or a
card on a page (the dashboard), never a stopped run. A store that cannot be reached
(``UpstreamError``) is not damage: it is raised as it is.

A damaged rollout row is ``RolloutUnreadable`` (``store.codecs``), naming the rollout and the column:
``get_rollout`` raises it, ``list_rollouts`` leaves the row out (logged) and ``claim_rollouts`` ends
it as an infrastructure failure instead of handing it out; one damaged while it runs is ended the
same way by ``fail_unreadable_rollout`` (the controller's end of such an attempt). A damaged call row
is ``store.codecs.CallUnreadable``, naming the call, its attempt and the column. Both errors here are
``Conflict``s: the gateway answers them 409 ``conflict`` with their message, never a 500.
"""

from __future__ import annotations

from harnessrl.errors import Conflict, HarnessRLError, UpstreamError
from harnessrl.schemas import Call
from harnessrl.store.base import Store
from harnessrl.store.codecs import RolloutUnreadable

__all__ = ["DAMAGED_ROW", "CallsUnreadable", "RolloutUnreadable", "read_attempt_calls"]


class CallsUnreadable(Conflict):
    """The store holds call rows of an attempt that cannot be decoded. A ``Conflict``, as
    ``RolloutUnreadable``: the gateway answers it 409 ``conflict`` naming the damage."""


#: What decoding a damaged row raises: ``store.codecs``' own ``HarnessRLError`` (a chain base missing,
#: a prompt of the wrong length), JSON that does not parse (``ValueError``), a blob of the wrong size
#: or type (``ValueError``/``TypeError``), usage of the wrong shape, JSON nested past Python's depth.
DAMAGED_ROW = (HarnessRLError, ValueError, TypeError, KeyError, AttributeError, RecursionError)


def read_attempt_calls(store: Store, rollout_id: str, attempt: int) -> list[Call]:
    """One attempt's recorded calls; ``CallsUnreadable`` naming the damage if a row cannot be decoded."""
    try:
        return store.list_calls(rollout_id, attempt=attempt)
    except UpstreamError:
        raise
    except DAMAGED_ROW as exc:
        raise CallsUnreadable(
            f"rollout {rollout_id} attempt {attempt}: its recorded calls cannot be read "
            f"(a damaged row): {type(exc).__name__}: {exc}"
        ) from exc
