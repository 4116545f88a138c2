"""The fast path's wire format: the script call framed as the bytes Redis reads (RESP), and its
replies unpacked. redis-py's encoder decides each argument's bytes, so a call framed here is the
call redis-py would have sent; it is only made in one pass instead of one object per argument
(and a finish template's commands are framed as they are filled in: `Framed`).
"""

from __future__ import annotations

from itertools import accumulate
from struct import Struct
from typing import TYPE_CHECKING, Any

from herder.worker.fast_path.script import SCRIPT_SHA

if TYPE_CHECKING:
    from herder.worker.fast_path.start_template import StartTemplate


def make_encoder(encoder: Any) -> Any:
    """redis-py's encoding of an argument, with its common cases inlined (the same bytes). The
    function says whether it is the inlined one (`utf8`): resp_request then inlines it too."""
    if (encoder.encoding, encoder.encoding_errors) != ("utf-8", "strict"):
        return encoder.encode

    def encode(a: Any) -> bytes:
        kind = type(a)
        if kind is bytes:
            return a
        if kind is str:
            return a.encode()
        if kind is int:
            return b"%d" % a
        return repr(a).encode() if kind is float else encoder.encode(a)  # redis-py's repr of a float

    encode.utf8 = True  # type: ignore[attr-defined]
    return encode


# A bulk string's header by its length: a lookup, not a bytes format (half the framing's cost).
_HEADS = [b"$%d" % n for n in range(512)]


def _framed(args: list[Any], encode: Any) -> bytes:
    """The arguments as RESP bulk strings, in one pass. With the inlined utf-8 encoder
    (make_encoder) its common cases are inlined here too: no call per argument (a job's call
    has about 140). Each string is its header and its bytes, all joined by CRLFs."""
    parts: list[bytes] = []
    add = parts.append
    utf8 = getattr(encode, "utf8", False)
    for a in args:
        kind = type(a)
        if kind is str and utf8:
            v = a.encode()
        elif kind is bytes:
            v = a
        elif kind is int and utf8:
            v = b"%d" % a
        elif kind is float and utf8:  # a time's score: redis-py's repr
            v = repr(a).encode()
        else:
            v = encode(a)
        n = len(v)
        add(_HEADS[n] if n < 512 else b"$%d" % n)
        add(v)
    add(b"")  # the last string's CRLF
    return b"\r\n".join(parts)


_KEYS: dict[str, bytes] = {}  # a hash field's name framed (its header and bytes), by name


def framed_fields(fields: dict[Any, Any], encode: Any) -> tuple[bytes, int]:
    """An HSET mapping framed as `_framed` frames its flat key, value, key, value list (the same
    bytes), and its number of arguments. The names' framing is kept: a job's to_dict has the same
    twenty-odd names every time. With an encoder not inlined (make_encoder), `_framed` itself."""
    if not getattr(encode, "utf8", False):
        flat = [x for pair in fields.items() for x in pair]
        return _framed(flat, encode), len(flat)
    parts: list[bytes] = []
    add = parts.append
    keys = _KEYS
    for k, a in fields.items():
        key = keys.get(k) if type(k) is str else None
        if key is None:
            key = _framed([k], encode)[:-2]  # the CRLF after it is the join's
            if type(k) is str and len(keys) < 4096:
                keys[k] = key
        add(key)
        kind = type(a)  # the value encoded as in _framed, inlined there and here: a call a value costs
        if kind is str:
            v = a.encode()
        elif kind is bytes:
            v = a
        elif kind is int:
            v = b"%d" % a
        elif kind is float:
            v = repr(a).encode()
        else:
            v = encode(a)
        n = len(v)
        add(_HEADS[n] if n < 512 else b"$%d" % n)
        add(v)
    add(b"")
    return b"\r\n".join(parts), 2 * len(fields)


class Framed:
    """Commands framed already (finish_template.py): `data` holds `args` RESP bulk strings, the
    `commands` commands' argument counts and arguments, as resp_request frames a command."""

    __slots__ = ("args", "commands", "data")

    def __init__(self, data: bytes, args: int, commands: int) -> None:
        self.data, self.args, self.commands = data, args, commands

    def parsed(self) -> list[list[bytes]]:
        """The commands read back, each its arguments' bytes (to check them against RQ's)."""
        data, at = self.data, 0

        def bulk() -> bytes:
            nonlocal at
            end = data.index(b"\r\n", at)
            if data[at : at + 1] != b"$":
                raise ValueError(f"not a bulk string at {at}")
            n = int(data[at + 1 : end])
            value, at = data[end + 2 : end + 2 + n], end + 4 + n
            if data[at - 2 : at] != b"\r\n":
                raise ValueError(f"a bulk string of the wrong length at {end}")
            return value

        out = [[bulk() for _ in range(int(bulk()))] for _ in range(self.commands)]
        if at != len(data) or sum(1 + len(c) for c in out) != self.args:
            raise ValueError("framed commands of another size than they say")
        return out


def frame(value: bytes) -> bytes:
    """One bulk string."""
    n = len(value)
    return b"%b\r\n%b\r\n" % (_HEADS[n] if n < 512 else b"$%d" % n, value)


def resp_request(
    call: list[Any],
    guards: list[str],
    commands: list[Any],
    start: tuple[StartTemplate, list[Any]] | None,
    take: list[Any],
    encode: Any,
    owner: tuple[str, str] | tuple[str, str, int] | None = None,
    fence: tuple[str, int | str, str] | None = None,
) -> bytes:
    """The EVALSHA call as the bytes Redis reads (RESP), framed here in one pass: redis-py's
    per-argument packing was a third of the worker's CPU per job. Each command goes as its own
    arguments, so the script splits nothing (splitting one joined argument in Lua cost Redis
    about 16 us a call); each argument's bytes are what redis-py's encoder makes of it. A start
    template's commands are framed once, when it is made. `call`: the worker's call record key,
    the call's number and the job key prefix (script.py); `owner`: the StartedJobRegistry key, the
    member a finish is for and the job's moves when it was taken (if known): the finish's fence;
    `fence`: a start's, the job's id, its moves when it was taken ('' if not known) and the
    intermediate list it is taken out of ('' for none)."""
    if owner:
        held: list[Any] = ["F", *owner] if len(owner) == 3 else ["F", *owner, ""]
    else:
        held = ["S", *fence] if fence else ["0"]
    n = sum(c.commands if type(c) is Framed else 1 for c in commands)
    args: list[Any] = ["EVALSHA", SCRIPT_SHA, 0, *call, *held, len(guards), *guards, n]
    chunks: list[bytes] = []
    size = 0
    for command in commands:
        if type(command) is Framed:  # a finish template's: framed when filled in
            chunks.append(_framed(args, encode))
            chunks.append(command.data)
            size += len(args) + command.args
            args = []
            continue
        args.append(len(command))
        args.extend(command)
    framed, framed_size = b"", 0
    if start is None:
        args.append(0)
    else:
        template, values = start
        args.extend(values)
        framed, framed_size = template.framed, template.size
    return b"*%d\r\n%b%b%b%b" % (
        size + len(args) + framed_size + len(take),
        b"".join(chunks),
        _framed(args, encode),
        framed,
        _framed(take, encode),
    )


_SIZES: dict[int, Struct] = {}  # the script's packed sizes (big-endian 32-bit), by count


def unpack_hash(sizes: bytes, joined: bytes) -> dict[bytes, bytes]:
    """A hash the script sent as its fields' sizes (packed) and the fields joined (HGETALL's
    order)."""
    count = len(sizes) >> 2
    layout = _SIZES.get(count)
    if layout is None:
        layout = _SIZES[count] = Struct(f">{count}I")
    fields, at = [], 0
    add = fields.append
    for end in accumulate(layout.unpack(sizes)):
        add(joined[at:end])
        at = end
    pairs = iter(fields)
    return dict(zip(pairs, pairs, strict=True))


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
