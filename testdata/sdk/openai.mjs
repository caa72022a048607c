// OpenAI's SDK against the gateway: a request too large for its tpm is a
// RateLimitError that the SDK does not retry (x-should-retry: false), even
// with retries on. Prints a JSON report.
import OpenAI from 'openai';

let calls = 0;
const client = new OpenAI({
  apiKey: 'sk-' + process.env.KEY, baseURL: process.env.GATEWAY + '/v1', maxRetries: 3,
  fetch: (url, init) => { calls++; return fetch(url, init); },
});
const report = {};
try {
  await client.chat.completions.create({ model: 'gpt-4o', max_tokens: 5000, messages: [{ role: 'user', content: 'hi' }] });
  report.refused = false;
} catch (e) {
  report.refused = true;
  report.rateLimitError = e instanceof OpenAI.RateLimitError;
  report.type = e.type ?? e.error?.type;
  report.message = e.message;
}
report.calls = calls;
console.log(JSON.stringify(report));
