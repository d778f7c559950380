// Streams one completion through an OpenAI-compatible server with the official `openai`
// client, for tests/chaos/router_stream_test.cc.
//
//   node stream_completion.mjs --base-url URL --model M --prompt P --seed S
//                              --temperature T --max-tokens N [--signal-after K] [--chat 1]
//
// With --chat 1 it streams a chat completion instead: one user message with the prompt, the
// text read from each chunk's delta.content, max_completion_tokens N.
//
// Prints JSON lines on stdout:
//   {"event":"chunks","count":K}   once, after the K-th chunk (with --signal-after K)
//   {"event":"done", ...}          at the end: the text and token ids of the whole stream,
//                                  the chunk count, the chunk ids, `created` and `object`
//                                  values seen,
//                                  and, when the test wrote a line to stdin, how many
//                                  chunks came after it
//   {"event":"error", ...}         instead of "done" when the client raised an error
// A line on stdin ("killed") marks the moment the test injected its fault. The client does
// not retry (maxRetries 0): a retried request would hide a lost one. Exit 0 on done, 1 on
// an error, 2 on bad usage.
import OpenAI from 'openai';
import readline from 'node:readline';

function parseArgs(argv) {
  const want = ['base-url', 'model', 'prompt', 'seed', 'temperature', 'max-tokens'];
  const args = {'signal-after': '0', 'chat': '0'};
  for (let i = 2; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, '');
    if (!argv[i].startsWith('--') || i + 1 >= argv.length) {
      throw new Error(`bad argument: ${argv[i]}`);
    }
    args[key] = argv[i + 1];
  }
  for (const k of want) {
    if (args[k] === undefined) throw new Error(`--${k} is required`);
  }
  return args;
}

function emit(obj) {
  process.stdout.write(JSON.stringify(obj) + '\n');
}

let args;
try {
  args = parseArgs(process.argv);
} catch (e) {
  process.stderr.write(`stream_completion: ${e.message}\n`);
  process.exit(2);
}

const signalAfter = Number(args['signal-after']);
let chunks = 0;
let signalledAt = -1;  // the chunk count when the stdin line came
let text = '';
const tokenIds = [];
const ids = new Set();
const created = new Set();
const objects = new Set();
let finishReason = null;

readline.createInterface({input: process.stdin}).on('line', () => {
  if (signalledAt < 0) signalledAt = chunks;
});

function summary() {
  return {
    text,
    token_ids: tokenIds,
    chunks,
    signalled: signalledAt >= 0,
    chunks_after_signal: signalledAt >= 0 ? chunks - signalledAt : 0,
    ids: [...ids],
    created: [...created],
    objects: [...objects],
    finish_reason: finishReason,
  };
}

const client = new OpenAI({
  baseURL: args['base-url'],
  apiKey: process.env.OPENAI_API_KEY || 'unused',
  maxRetries: 0,
  timeout: 60_000,
});

try {
  const chat = args.chat === '1';
  const common = {
    model: args.model,
    seed: Number(args.seed),
    temperature: Number(args.temperature),
    stream: true,
  };
  const stream = chat
      ? await client.chat.completions.create({
          ...common,
          messages: [{role: 'user', content: args.prompt}],
          max_completion_tokens: Number(args['max-tokens']),
        })
      : await client.completions.create(
            {...common, prompt: args.prompt, max_tokens: Number(args['max-tokens'])});
  for await (const chunk of stream) {
    chunks += 1;
    ids.add(chunk.id);
    created.add(chunk.created);
    objects.add(chunk.object);
    const choice = chunk.choices?.[0];
    if (choice) {
      text += (chat ? choice.delta?.content : choice.text) ?? '';
      for (const id of choice.token_ids ?? []) tokenIds.push(id);
      if (choice.finish_reason) finishReason = choice.finish_reason;
    }
    if (chunks === signalAfter) emit({event: 'chunks', count: chunks});
  }
  emit({event: 'done', ...summary()});
  process.exit(0);
} catch (e) {
  emit({event: 'error', message: String(e?.message ?? e), status: e?.status ?? null,
        ...summary()});
  process.exit(1);
}
