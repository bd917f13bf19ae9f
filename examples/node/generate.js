#!/usr/bin/env node
// Streams one completion from cbserve in Node.js, from the .proto file alone:
// @grpc/proto-loader reads proto/cbserve/v1/generation.proto at run time, so
// there is no generated code and nothing from the Python side.
//
//   npm ci --prefix examples/node
//   node examples/node/generate.js --server localhost:50051 "The capital of France is"
//   node examples/node/generate.js --chat --temperature 0 "What is the capital of France?"
//
// The reply's text goes to stdout as it streams (then one newline); the finish
// reason and token counts go to stderr. A gRPC error prints its status code and
// message on stderr and exits 1.
"use strict";

const path = require("node:path");
const { parseArgs } = require("node:util");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

const PROTO_ROOT = path.resolve(__dirname, "..", "..", "proto");
const PROTO_FILE = "cbserve/v1/generation.proto";

const USAGE = `usage: node generate.js [--server HOST:PORT] [--chat] [--temperature F]
                        [--max-tokens N] [--ignore-eos] [--seed N] [--priority N]
                        [--timeout SECONDS] PROMPT`;

const OPTIONS = {
  server: { type: "string", default: process.env.CBSERVE_SERVER || "localhost:50051" },
  chat: { type: "boolean", default: false },
  temperature: { type: "string" },
  "max-tokens": { type: "string" },
  "ignore-eos": { type: "boolean", default: false },
  seed: { type: "string" },
  priority: { type: "string", default: "0" },
  timeout: { type: "string", default: "60" },
  help: { type: "boolean", short: "h", default: false },
};

function parseCommandLine() {
  let parsed;
  try {
    parsed = parseArgs({ options: OPTIONS, allowPositionals: true });
  } catch (error) {
    console.error(`${USAGE}\ngenerate.js: ${error.message}`);
    process.exit(2);
  }
  const { values, positionals } = parsed;
  if (values.help) {
    console.log(USAGE);
    process.exit(0);
  }
  if (positionals.length !== 1) {
    console.error(`${USAGE}\ngenerate.js: give exactly one PROMPT`);
    process.exit(2);
  }
  return { ...values, prompt: positionals[0] };
}

function buildRequest(args) {
  // Field names as in the .proto (keepCase below). An unset optional field takes the
  // server's default; temperature 0 is sent as a value, and means greedy.
  const sampling = { ignore_eos: args["ignore-eos"] };
  if (args.temperature !== undefined) sampling.temperature = Number(args.temperature);
  if (args["max-tokens"] !== undefined) sampling.max_tokens = Number(args["max-tokens"]);
  if (args.seed !== undefined) sampling.seed = args.seed; // uint64: a decimal string
  const request = { sampling, priority: Number(args.priority) };
  if (args.chat) {
    request.chat = { messages: [{ role: "user", content: args.prompt }] };
  } else {
    request.prompt = args.prompt;
  }
  return request;
}

function main() {
  const args = parseCommandLine();
  const definition = protoLoader.loadSync(PROTO_FILE, {
    includeDirs: [PROTO_ROOT],
    keepCase: true, // request_id, max_tokens, ... as written in the .proto
    longs: String, // uint64 fields (seed, kv_capacity_tokens) as strings
    enums: String, // finish_reason as "STOP", "LENGTH", "ABORT"
    defaults: true,
    oneofs: true,
  });
  const { Generation } = grpc.loadPackageDefinition(definition).cbserve.v1;
  const client = new Generation(args.server, grpc.credentials.createInsecure());

  const deadline = new Date(Date.now() + Number(args.timeout) * 1000);
  const call = client.Generate(buildRequest(args), { deadline });
  call.on("data", (response) => {
    process.stdout.write(response.text);
    if (response.finish_reason !== "FINISH_REASON_UNSPECIFIED") {
      const usage = response.usage;
      console.error(
        `[${response.finish_reason}] request_id=${response.request_id} ` +
          `prompt_tokens=${usage.prompt_tokens} completion_tokens=${usage.completion_tokens} ` +
          `cached_prompt_tokens=${usage.cached_prompt_tokens}`,
      );
    }
  });
  let failed = false;
  call.on("error", (error) => {
    // A non-OK status: emitted before "end", which may follow it.
    failed = true;
    console.error(`\ngenerate.js: ${grpc.status[error.code]}: ${error.details}`);
    process.exitCode = 1;
    client.close();
  });
  call.on("end", () => {
    if (!failed) process.stdout.write("\n");
    client.close();
  });
}

main();
