"""A run's turns as requests: what each turn's prompt holds, and conversations whose next turn waits for
the previous reply (`workload.multi_turn.timing: after_reply`).

`TurnBuilder` holds the columns `kvsim.workload.generate.iter_requests` drew and builds one turn from
them: its prompt is the conversation so far (a shared system prompt, every earlier prompt and reply)
plus the turn's new message, as segments, so that prefix caching hits exactly where a chat client resends
the history. Both timings build every turn through it, so a turn's content does not depend on when it is
sent.

Both timings carry the reply a turn actually got into the next turn's prompt, as vLLM's multi-turn benchmark
client does (benchmarks/multi_turn/benchmark_serving_multi_turn.py, `send_turn`: "Update the answer" replaces the
dataset's answer with the generated text before the next turn is sent): a reply cut at a replica's max_model_len
(`Request.cap_output`) is carried as cut, a refused turn's not at all (`served_reply_len`).

`OpenTurns` serves `open` timing: each turn is built when it arrives, its previous turn already sent, so a
turn refused on arrival (a fleet's smaller replica refuses a prompt a larger one serves) leaves no reply in
the next turn's prompt, and a reply that replica cut is carried as cut.

`Conversations` serves `after_reply`: only the first turns' instants are known up front (the arrival
process's draws); turn k + 1 of a conversation is sent `think_time_s` after turn k ended, which only the
run knows (`kvsim.engine.turns`). It builds a conversation's next turn when the run sends it and keeps the
history of the conversations in progress only (a turn in flight or waiting for its think time).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import numpy as np

from kvsim.workload.content import Content, SegmentContent, TokenContent
from kvsim.workload.request import Request, RequestStatus
from kvsim.workload.traces import TraceRecord
from kvsim.workload.traffic import SharedPrefix

Segments = list[tuple[Hashable, int]]  # (segment id, tokens), in prompt order
History = Segments | tuple[Hashable, ...]  # what a turn starts from: segments, or a token-id conversation's tokens


class TurnBuilder:
    """Turn `index` of the run's records (record `index` is turn `index % turns` of conversation
    `index // turns`) as a request, from the columns drawn for the run."""

    __slots__ = ("records", "turns", "max_model_len", "prefix", "with_prefix", "prefix_ids", "num_samples", "beam",
                 "priorities", "with_acceptance", "token_level")

    def __init__(self, records: Sequence[TraceRecord], turns: int, max_model_len: int, prefix: SharedPrefix | None,
                 with_prefix: np.ndarray, prefix_ids: np.ndarray | None, num_samples: int, beam: bool,
                 priorities: np.ndarray | None, with_acceptance: bool) -> None:
        self.records, self.turns, self.max_model_len = records, turns, max_model_len
        self.prefix, self.with_prefix, self.prefix_ids = prefix, with_prefix, prefix_ids
        self.num_samples, self.beam, self.priorities = num_samples, beam, priorities
        self.with_acceptance = with_acceptance
        self.token_level = any(record.token_ids is not None for record in records)  # a trace of token ids

    def content(self, index: int, history: History) -> tuple[int, int, Content, History]:
        """Turn `index`'s prompt and output lengths, its content, and the history the conversation's next turn
        starts from (this turn's prompt and reply). `history`: what the previous turn returned (ignored on a
        conversation's first turn, which starts from the system prompt, if the request has one). The output
        is capped so that prompt + output ≤ max_model_len (`_output_len`).

        In a trace of token ids every turn is a `TokenContent` (`_token_content`): the history is the
        conversation's tokens so far (the system prompt's too, each of its tokens named by its segment's id),
        so a turn's blocks hash as its previous turn's did and it hits them, as the segments of other
        conversations do, and two rows of the same ids behind the same system prompt share it all. A first
        turn's ids were taken only without a system prompt (the system prompt was all two such rows shared),
        and its later turns were segments that named its blocks apart (no turn after it hit anything). A
        token the record does not give (a reply's without `output_tok_ids`, a row's without ids) is its
        segment's id, so the request still owns the blocks it fills: a preempted request finds its own
        reply's blocks again, as vLLM hashes the tokens it generated (its content stopped at the prompt, and
        the lookup of a preempted request asserted)."""
        record = self.records[index]
        conv, turn = divmod(index, self.turns)
        if turn == 0:
            system: Segments = []
            prefix = self.prefix
            if prefix is not None and self.prefix_ids is not None and self.with_prefix[index]:
                system.append((("system", int(self.prefix_ids[index])), prefix.tokens))
            history = tuple(seg for seg, length in system for _ in range(length)) if self.token_level else system
        if self.token_level:
            assert isinstance(history, tuple), "a turn of a token-id conversation follows tokens"
            return self._token_content(record, conv, turn, history)
        if record.segments is not None:
            prompt_segments = [*history, *record.segments]
        else:
            prompt_segments = [*history, (("user", conv, turn), record.prompt_len)]
        prompt_len = sum(length for _, length in prompt_segments)
        output_len = self._output_len(record, prompt_len)
        out_segment = (("reply", conv, turn), output_len)
        return prompt_len, output_len, SegmentContent([*prompt_segments, out_segment]), [*prompt_segments, out_segment]

    def _token_content(self, record: TraceRecord, conv: int, turn: int,
                       history: tuple[Hashable, ...]) -> tuple[int, int, Content, History]:
        """`content` for a conversation of token ids: its tokens so far, this turn's prompt and its reply (the
        record's ids where it gives them, else the segment's id for each token)."""
        ids = record.token_ids or ()
        prompt = ids[:record.prompt_len] if ids else (("user", conv, turn),) * record.prompt_len
        prompt_len = len(history) + record.prompt_len
        output_len = self._output_len(record, prompt_len)
        known = ids[record.prompt_len:record.prompt_len + output_len]
        reply = known if len(known) == output_len else (("reply", conv, turn),) * output_len
        tokens = (*history, *prompt, *reply)
        return prompt_len, output_len, TokenContent(tokens), tokens

    def _output_len(self, record: TraceRecord, prompt_len: int) -> int:
        """The record's output length (at least 1 token), capped so that prompt + output ≤ max_model_len; not
        capped where the prompt alone reaches max_model_len (the scheduler refuses the prompt; its row keeps the
        output asked, as `Request.cap_output` leaves it, where it was 1, a length no one asked for)."""
        room = self.max_model_len - prompt_len
        return max(1, record.output_len if room <= 0 else min(record.output_len, room))

    def answered(self, history: History, output_len: int, reply_len: int) -> History:
        """`history` (what `content` returned for a turn whose reply is `output_len` tokens) with a reply of
        `reply_len` ≤ `output_len` tokens instead: the first `reply_len` of them (a reply the serving replica cut at
        its max_model_len is the start of the one asked), none for a turn that was refused (`reply_len` 0).
        `history` itself where nothing is cut."""
        assert 0 <= reply_len <= output_len, "a turn gets at most the reply its content was built with"
        if reply_len == output_len:
            return history
        if self.token_level:
            assert isinstance(history, tuple), "a turn of a token-id conversation follows tokens"
            return history[:len(history) - output_len + reply_len]
        assert isinstance(history, list) and history[-1][1] == output_len, "a turn's history ends with its reply"
        reply_id = history[-1][0]
        return [*history[:-1], (reply_id, reply_len)] if reply_len else history[:-1]

    def request(self, index: int, request_id: int, arrival_s: float, prompt_len: int, output_len: int,
                content: Content) -> Request:
        """Turn `index` as the request `request_id` arriving at `arrival_s` (its conversation's priority, its
        record's acceptance lengths). The output tokens `content` cut from the record's (`_output_len`) are its
        `num_length_capped_tokens`; none when the prompt alone reaches max_model_len (the scheduler refuses it)."""
        priorities = self.priorities
        record = self.records[index]
        capped = record.output_len - output_len if prompt_len < self.max_model_len else 0
        return Request(request_id=request_id, arrival_s=arrival_s, prompt_len=prompt_len, output_len=output_len,
                       content=content, num_samples=self.num_samples, beam=self.beam,
                       priority=int(priorities[index // self.turns]) if priorities is not None else 0,
                       acceptance_lengths=record.acceptance_lengths if self.with_acceptance else None,
                       num_length_capped_tokens=capped)


def served_reply_len(req: Request) -> int:
    """The reply, in tokens, the client of turn `req` gets, as the engine it was sent to decided when it arrived
    (`kvsim.sched.admission.Admission.accept`): none if refused, else its output as that engine capped it
    (`Request.cap_output`: a reply that reaches max_model_len ends there, finish_reason "length")."""
    return 0 if req.status is RequestStatus.REJECTED else req.output_len


class OpenTurns:
    """`timing: open`'s turns (`kvsim.workload.generate.iter_requests`), each built when it arrives, from its
    conversation's history with the reply its previous turn got (`reply_len`): none for a turn refused on arrival
    (its prompt reaches the max_model_len of the replica it was routed to, or it can never fit a pool), so the next
    turn's prompt holds the refused turn's prompt and no reply (in a fleet whose replicas' limits differ a smaller
    replica refused a turn whose reply, never generated, still came in the next turn's prompt, which a larger
    replica then served); the reply as cut where the replica's max_model_len cut it (the next turn carried the
    whole reply asked, of which the client got only the start). A turn arrives only after its previous turn was
    sent (`timing: open` sends turn k + 1 think times after turn k, and the arrival process sends each request as
    it takes it), so the engine's decision is known. `reply_len` (default `served_reply_len`) is the run's to
    replace where the engine that first takes a turn does not decide its reply (a disaggregated fleet's prefill
    instance: `kvsim.fleet.disagg_pools.Disaggregation.reply_len`). Only the conversations in progress are kept:
    the history after the last turn sent and that turn's request."""

    __slots__ = ("builder", "reply_len", "_ongoing")

    def __init__(self, builder: TurnBuilder) -> None:
        self.builder = builder
        self.reply_len: Callable[[Request], int] = served_reply_len
        self._ongoing: dict[int, tuple[History, int, Request]] = {}  # conversation -> (history, reply len, turn)

    def request(self, index: int, request_id: int, arrival_s: float) -> Request:
        """Turn `index` (its conversation's previous turn already sent) as request `request_id` at `arrival_s`."""
        builder = self.builder
        conv, turn = divmod(index, builder.turns)
        history: History = []
        if turn:
            history, asked_len, previous = self._ongoing.pop(conv)
            history = builder.answered(history, asked_len, self.reply_len(previous))
        prompt_len, output_len, content, history = builder.content(index, history)
        req = builder.request(index, request_id, arrival_s, prompt_len, output_len, content)
        if turn + 1 < builder.turns and index + 1 < len(builder.records):
            self._ongoing[conv] = (history, output_len, req)
        return req


class Conversations:
    """`after_reply` conversations, each turn built when the run sends it (`send`).

    Conversation c holds records c·turns … (the last one may hold fewer turns: `num_requests` need not be
    a multiple of `turns`). `first_arrival_s[c]` is when its first turn arrives (ascending). The run calls
    `send(c, request_id, now)` for the first turn and, each time the previous turn ended, `ended(c, finished)`,
    then `send` again after the think time if `ended` says a turn follows. A rejected turn ends its
    conversation: vLLM's multi-turn benchmark client (benchmarks/multi_turn/benchmark_serving_multi_turn.py,
    `client_main`) drops a conversation whose request failed ("Remove the conversation (should not be used
    again)"), so its later turns are never sent. A finished turn's next turn carries the reply it got
    (`served_reply_len`: cut where the replica that served it cut it at its max_model_len), as the client's
    `send_turn` stores the generated answer for the next turn.
    """

    __slots__ = ("builder", "first_arrival_s", "think_time_s", "num_requests", "_history")

    def __init__(self, builder: TurnBuilder, first_arrival_s: np.ndarray, think_time_s: float) -> None:
        self.builder, self.first_arrival_s, self.think_time_s = builder, first_arrival_s, think_time_s
        self.num_requests = len(builder.records)  # every turn of every conversation: the most a run can send
        # conversation -> (its next turn, history so far, the reply length the history holds, the turn in flight)
        self._history: dict[int, tuple[int, History, int, Request | None]] = {}

    def __len__(self) -> int:
        return self.num_requests

    @property
    def num_conversations(self) -> int:
        return len(self.first_arrival_s)

    @property
    def num_in_progress(self) -> int:
        """Conversations started and not ended: the ones whose history is kept."""
        return len(self._history)

    def send(self, conv: int, request_id: int, arrival_s: float) -> Request:
        """Conversation `conv`'s next turn (its first if it has not started), as request `request_id` sent at
        `arrival_s`."""
        turn, history, _, in_flight = self._history.get(conv, (0, [], 0, None))
        index = conv * self.builder.turns + turn
        assert index < self.num_requests and (turn == 0) == (conv not in self._history) and in_flight is None
        prompt_len, output_len, content, next_history = self.builder.content(index, history)
        req = self.builder.request(index, request_id, arrival_s, prompt_len, output_len, content)
        self._history[conv] = (turn + 1, next_history, output_len, req)
        return req

    def ended(self, conv: int, finished: bool) -> bool:
        """The turn of `conv` in flight ended (finished, or rejected); True if another turn follows (the
        history is kept for it, with the reply the turn got), False if the conversation is over (its history
        let go)."""
        next_turn, history, asked_len, req = self._history[conv]
        assert req is not None, "a turn of the conversation is in flight"
        if finished and next_turn < self.builder.turns and conv * self.builder.turns + next_turn < self.num_requests:
            self._history[conv] = (next_turn, self.builder.answered(history, asked_len, served_reply_len(req)), 0,
                                   None)
            return True
        del self._history[conv]
        return False
