// Anthropic's SDK, with its default retries, against a key under a day
// budget: the first request fits it; the next is refused as Anthropic
// refuses a spend limit reached, which the SDK raises as its
// EnforcedSpendLimitReachedError (a RateLimitError) and does not retry; and
// a model the gateway has no price for is a BadRequestError, not retried
// either. Prints a JSON report.
import Anthropic from '@anthropic-ai/sdk';
import { recordingFetch, refused } from './refusals.mjs';

const { fetch, responses } = recordingFetch();
const client = (key) => new Anthropic({ apiKey: key, baseURL: process.env.GATEWAY, fetch });
const ask = (c, model, signal) => c.messages.create({ model, max_tokens: 5, messages: [{ role: 'user', content: 'hi' }] }, { signal });
const describe = (e) => ({
  rateLimitError: e instanceof Anthropic.RateLimitError,
  enforcedSpendLimitReachedError: e instanceof Anthropic.EnforcedSpendLimitReachedError,
  badRequestError: e instanceof Anthropic.BadRequestError,
  status: e.status, errorCode: e.errorCode, type: e.error?.error?.type, message: e.message,
});

const report = {};
const c = client('sk-ant-' + process.env.KEY);
const answer = await ask(c, 'claude-sonnet-4-5');
report.day = await refused(responses, (signal) => ask(c, 'claude-sonnet-4-5', signal), describe);
report.day.answered = answer.type === 'message';
report.unpriced = await refused(responses, (signal) => ask(client(`sk-ant-${process.env.KEY}-unpriced`), 'claude-unpriced', signal), describe);
console.log(JSON.stringify(report));
