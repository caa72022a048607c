// OpenAI's SDK against a key whose one slot of requests in flight is held:
// the gateway's 429 names no wait, and the SDK retries it on its own
// backoff, getting through once the slot is free. Prints a JSON report.
import OpenAI from 'openai';

const calls = [];
const client = new OpenAI({
  apiKey: 'sk-' + process.env.KEY, baseURL: process.env.GATEWAY + '/v1', maxRetries: 2,
  fetch: async (url, init) => {
    const res = await fetch(url, init);
    calls.push({ at: Date.now(), status: res.status, retryAfter: res.headers.get('retry-after'), retryAfterMs: res.headers.get('retry-after-ms') });
    return res;
  },
});
const report = {};
try {
  const completion = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
  report.answered = completion.choices[0].message.content === 'ok';
} catch (e) {
  report.answered = false;
  report.error = String(e);
}
report.statuses = calls.map((c) => c.status);
report.firstRetryAfter = calls[0]?.retryAfter ?? '';
report.firstRetryAfterMs = calls[0]?.retryAfterMs ?? '';
report.retriedAfterMs = calls.length > 1 ? calls[1].at - calls[0].at : 0;
console.log(JSON.stringify(report));
