// Cohere's SDK (v2 chat) against the gateway: each call's billed units as
// the SDK read them, in JSON and in a stream; a throttled call retried
// after the Retry-After the gateway gave, then answered; and a spent
// budget raised as the SDK's error of status 402, never retried. Each
// API key is KEY-<call>. Prints a JSON report.
import { CohereClientV2, CohereError } from 'cohere-ai';
import { recordingFetch } from './refusals.mjs';

const { fetch, responses } = recordingFetch();
const prompt = 'Price every token of this prompt exactly';
const client = (name) => new CohereClientV2({ token: `${process.env.KEY}-${name}`, environment: process.env.GATEWAY, fetch });
const request = (model = 'command-a-03-2025') => ({ model, messages: [{ role: 'user', content: prompt }], maxTokens: 100 });

// settled runs call and reports describe's fields of its answer, or the
// error the SDK raised, with the responses its fetch got meanwhile.
async function settled(call, describe) {
  const from = responses.length;
  const report = { start: Date.now() };
  try {
    Object.assign(report, await describe(await call()));
  } catch (e) {
    report.error = e.constructor?.name ?? '';
    report.cohereError = e instanceof CohereError;
    report.status = e.statusCode ?? 0;
    report.message = e.message;
  }
  report.responses = responses.slice(from);
  return report;
}

const report = {};
report.chat = await settled(() => client('chat').chat(request()),
  (out) => ({ usage: out.usage, text: out.message.content[0].text }));
report.chatStream = await settled(() => client('stream').chatStream(request()), async (stream) => {
  let text = '', usage;
  for await (const ev of stream) {
    if (ev.type === 'content-delta') text += ev.delta.message.content.text;
    if (ev.type === 'message-end') usage = ev.delta.usage;
  }
  return { usage, text };
});
// throttled-model has a bucket of one request a second.
report.throttledFirst = await settled(() => client('throttled').chat(request('throttled-model')), () => ({}));
report.throttledRetried = await settled(() => client('throttled').chat(request('throttled-model')), () => ({}));
// KEY-budget's day budget fits one request.
report.budgetFirst = await settled(() => client('budget').chat(request()), () => ({}));
report.budgetRefused = await settled(() => client('budget').chat(request()), () => ({}));
console.log(JSON.stringify(report));
