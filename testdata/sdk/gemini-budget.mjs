// Google's SDK, with its default of no retries, against a key under a day
// budget: the first request fits it; the next is refused as Google refuses
// a quota exhausted, an ApiError of status 429 whose message is the error
// body (RESOURCE_EXHAUSTED, a QuotaFailure and a RetryInfo); and a model
// the gateway has no price for is an ApiError of status 400. Neither is
// retried. Prints a JSON report.
import { GoogleGenAI, ApiError } from '@google/genai';
import { recordingFetch, refused } from './refusals.mjs';

const { fetch, responses } = recordingFetch();
const client = (key) => new GoogleGenAI({ apiKey: key, httpOptions: { baseUrl: process.env.GATEWAY, fetch } });
const ask = (c, model, abortSignal) => c.models.generateContent({ model, contents: 'hi', config: { maxOutputTokens: 5, abortSignal } });
const describe = (e) => {
  let body = null;
  try { body = JSON.parse(e.message); } catch { /* reported as null */ }
  return { apiError: e instanceof ApiError, status: e.status, body, message: e.message };
};

const report = {};
const c = client('goog-' + process.env.KEY);
const answer = await ask(c, 'gemini-2.5-flash');
report.day = await refused(responses, (signal) => ask(c, 'gemini-2.5-flash', signal), describe);
report.day.answered = answer.text === 'ok';
report.unpriced = await refused(responses, (signal) => ask(client(`goog-${process.env.KEY}-unpriced`), 'gemini-unpriced', signal), describe);
console.log(JSON.stringify(report));
