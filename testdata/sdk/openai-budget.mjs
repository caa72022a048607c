// OpenAI's SDK, with its default retries, against keys under a spend
// budget: the first request fits it; the next is refused as OpenAI refuses
// a spent quota, a RateLimitError of code insufficient_quota, which the SDK
// does not retry, under a day budget (keys sk-day-…) and a month budget
// (sk-month-…); and a model the gateway has no price for is a
// BadRequestError, not retried either. Prints a JSON report.
import OpenAI from 'openai';
import { recordingFetch, refused } from './refusals.mjs';

const { fetch, responses } = recordingFetch();
const client = (key) => new OpenAI({ apiKey: key, baseURL: process.env.GATEWAY + '/v1', fetch });
const ask = (c, model, signal) => c.chat.completions.create({ model, max_tokens: 5, messages: [{ role: 'user', content: 'hi' }] }, { signal });
const describe = (e) => ({
  rateLimitError: e instanceof OpenAI.RateLimitError,
  badRequestError: e instanceof OpenAI.BadRequestError,
  status: e.status, code: e.code, type: e.type, errorCode: e.error?.code, message: e.message,
});

const report = {};
for (const period of ['day', 'month']) {
  const c = client(`sk-${period}-${process.env.KEY}`);
  const answer = await ask(c, 'gpt-4o-mini');
  report[period] = await refused(responses, (signal) => ask(c, 'gpt-4o-mini', signal), describe);
  report[period].answered = answer.choices[0].message.content === 'ok';
}
report.unpriced = await refused(responses, (signal) => ask(client(`sk-day-${process.env.KEY}-unpriced`), 'gpt-unpriced', signal), describe);
console.log(JSON.stringify(report));
