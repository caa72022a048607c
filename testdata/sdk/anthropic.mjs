// Anthropic's SDK against the gateway: a refusal is its RateLimitError with
// Anthropic's error object, and with retries on it waits the gateway's
// retry-after-ms and then succeeds. Prints a JSON report; exits 1 on failure.
import Anthropic from '@anthropic-ai/sdk';

const gateway = process.env.GATEWAY;
let calls = 0;
const fetchCounting = (url, init) => { calls++; return fetch(url, init); };
const client = (maxRetries) => new Anthropic({ apiKey: 'sk-ant-' + process.env.KEY, baseURL: gateway, maxRetries, fetch: fetchCounting });
const ask = (c) => c.messages.create({ model: 'claude-sonnet-4-5', max_tokens: 5, messages: [{ role: 'user', content: 'hi' }] });

const report = {};
await ask(client(0)); // takes the bucket's one token
try {
  await ask(client(0));
  report.refused = false;
} catch (e) {
  report.refused = true;
  report.rateLimitError = e instanceof Anthropic.RateLimitError;
  report.status = e.status;
  report.errorType = e.error?.error?.type;
  report.retryAfterMs = Number(e.headers?.get('retry-after-ms'));
}
calls = 0;
const start = Date.now();
const answer = await ask(client(2));
report.retriedCalls = calls;
report.retriedAfterMs = Date.now() - start;
report.answered = answer.type === 'message';
console.log(JSON.stringify(report));
