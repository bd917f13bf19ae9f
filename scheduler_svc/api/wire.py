"""The Generation service on the wire: responses built from outputs, and requests
that protobuf cannot parse answered INVALID_ARGUMENT instead of grpc's UNKNOWN."""

from __future__ import annotations

import grpc
from google.protobuf.message import DecodeError

from cbserve.v1 import generation_pb2 as pb
from scheduler_svc.api.tokenizer import Tokenizer
from scheduler_svc.core.request import RequestOutput, TokenLogprob


def _token_logprob(entry: TokenLogprob, tokenizer: Tokenizer) -> pb.TokenLogprob:
    return pb.TokenLogprob(
        token_id=entry.token_id,
        logprob=entry.logprob,
        top_logprobs=[
            pb.TopLogprob(
                token_id=token_id, logprob=logprob, token=tokenizer.id_to_token_text(token_id)
            )
            for token_id, logprob in entry.top
        ],
    )


def to_response(output: RequestOutput, tokenizer: Tokenizer) -> pb.GenerateResponse:
    response = pb.GenerateResponse(
        request_id=output.request_id, text=output.new_text, token_ids=output.new_token_ids
    )
    response.logprobs.extend(_token_logprob(entry, tokenizer) for entry in output.logprobs or ())
    response.prompt_logprobs.extend(
        _token_logprob(entry, tokenizer) for entry in output.prompt_logprobs or ()
    )
    if output.finish_reason is not None:
        response.finish_reason = output.finish_reason.to_proto()
        response.usage.CopyFrom(
            pb.Usage(
                prompt_tokens=output.prompt_tokens,
                completion_tokens=output.completion_tokens,
                cached_prompt_tokens=output.cached_prompt_tokens,
            )
        )
    return response


class Undecodable:
    """What a request that protobuf cannot parse (bad UTF-8 in a string field,
    corrupt wire bytes) becomes, so that the handler answers INVALID_ARGUMENT:
    grpc's own deserializer failure would answer UNKNOWN."""

    def __init__(self, error: DecodeError) -> None:
        self.error = error


def _lenient(parse):
    def deserialize(data: bytes):
        try:
            return parse(data)
        except DecodeError as error:
            return Undecodable(error)

    return deserialize


def add_to_server(service, server: grpc.aio.Server) -> None:
    """pb_grpc.add_GenerationServicer_to_server, with undecodable requests let through
    as Undecodable."""
    handlers = {
        "Generate": grpc.unary_stream_rpc_method_handler(
            service.Generate,
            request_deserializer=_lenient(pb.GenerateRequest.FromString),
            response_serializer=pb.GenerateResponse.SerializeToString,
        ),
        "GetModelInfo": grpc.unary_unary_rpc_method_handler(
            service.GetModelInfo,
            request_deserializer=_lenient(pb.GetModelInfoRequest.FromString),
            response_serializer=pb.ModelInfo.SerializeToString,
        ),
    }
    name = pb.DESCRIPTOR.services_by_name["Generation"].full_name
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))


async def refuse_undecodable(request, context: grpc.aio.ServicerContext) -> None:
    if isinstance(request, Undecodable):
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT, f"the request cannot be parsed: {request.error}"
        )
