"""Conversations: reading prompt/conversation files and rendering them with a chat template.

Shared by the builder (which renders, generates and masks whole samples) and live evaluation
(which renders the same prompts for the target), so that a store built from a file and a live
run over that file see exactly the same prompt ids::

    InputSample, iter_inputs             JSONL / JSON / Parquet / datasets folders -> conversations
    ChatRenderer, RenderedSample         chat-template rendering and the assistant loss mask
    stop_token_ids                       the ids generation stops on
    read_chat_template, use_chat_template   --chat-template FILE / --chat-template-kwargs JSON
"""

from __future__ import annotations

from osprey_data.conversation.chat_template import ChatRenderer, RenderedSample, stop_token_ids
from osprey_data.conversation.inputs import InputSample, iter_inputs, normalize_record, read_records, stable_id
from osprey_data.conversation.template_options import (check_template_kwargs, parse_template_kwargs,
                                                       read_chat_template, use_chat_template)

__all__ = ["ChatRenderer", "RenderedSample", "stop_token_ids", "InputSample", "iter_inputs", "normalize_record",
           "read_records", "stable_id", "read_chat_template", "use_chat_template", "parse_template_kwargs",
           "check_template_kwargs"]
