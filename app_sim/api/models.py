"""Request and response shapes of the app API (pydantic), strict and closed like the contract.

Requests forbid unknown fields and coerce nothing (``"1"`` is not an id, ``1.0`` is not an id,
``true`` is not a number). Text limits are the contract's (``MAX_TEXT_LENGTH`` code points), and
the API additionally refuses empty text, which the contract would accept.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from contract import MAX_TEXT_LENGTH

INT64_MAX = 2**63 - 1
MAX_LIMIT = 800  # the longest home timeline the views keep (setting timeline_length)
HANDLE_PATTERN = r"^[A-Za-z0-9_]{1,15}$"


def _unicode(value: str) -> str:
    # JSON may carry lone surrogates ("\ud800"), which are not text and cannot be UTF-8 encoded
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text (no lone surrogates)") from None
    return value


Id = Annotated[int, Field(ge=1, le=INT64_MAX, description="an int64 id (>= 1)")]
Text = Annotated[
    str,
    Field(min_length=1, max_length=MAX_TEXT_LENGTH, description=f"1 to {MAX_TEXT_LENGTH} code points"),
    AfterValidator(_unicode),
]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class NewUser(Strict):
    handle: Annotated[str, Field(pattern=HANDLE_PATTERN, description="1-15 ASCII letters, digits, _")]
    display_name: Annotated[str, Field(min_length=1, max_length=50), AfterValidator(_unicode)]


class NewFollow(Strict):
    followee_id: Id


class NewPost(Strict):
    text: Text


class NewMessage(Strict):
    recipient_id: Id
    text: Text


class NewStatus(Strict):
    text: Text


# --- responses (documentation for /openapi.json; handlers return JSON bytes directly) ------------


class Registered(BaseModel):
    user_id: int
    token: str = Field(description="bearer token: send `Authorization: Bearer <token>`")
    event_id: str
    partition: int
    offset: int


class Accepted(BaseModel):
    """The event is durably in the log at (partition, offset); visible once as_of[partition] > offset."""

    event_id: str
    type: str
    partition: int
    offset: int
    post_id: int | None = None
    message_id: int | None = None


AsOf = Annotated[
    dict[str, int],
    Field(
        description="per-partition end offsets the data covers: a write at (p, o) is in it iff as_of[p] > o"
    ),
]


class Post(BaseModel):
    post_id: int
    author_id: int
    text: str
    event_time: int


class Timeline(BaseModel):
    user_id: int
    posts: list[Post]
    as_of: AsOf


class Message(BaseModel):
    message_id: int
    sender_id: int = Field(description="0: sent by a user who has since been erased (docs/views.md)")
    text: str | None = Field(description="null when the sender is erased")
    event_time: int
    read: bool


class Inbox(BaseModel):
    user_id: int
    messages: list[Message]
    as_of: AsOf


class Unread(BaseModel):
    user_id: int
    unread: int
    as_of: AsOf


class StatusText(BaseModel):
    text: str
    event_time: int


class UserStatus(BaseModel):
    user_id: int
    status: StatusText | None
    as_of: AsOf


class Health(BaseModel):
    status: str
    namespace: str
    topic: str


class Error(BaseModel):
    error: str = Field(description="a stable code, e.g. invalid_request, unknown_user, unknown_post")
    detail: str = Field(description="what is wrong, for people")
    errors: list[dict] | None = Field(default=None, description="per-field problems (422)")
