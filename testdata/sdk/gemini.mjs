// Google's SDK against the gateway: a refusal is its ApiError with status
// 429 whose body says RESOURCE_EXHAUSTED with a RetryInfo delay; waiting that
// delay, the next call succeeds. Prints a JSON report.
import { GoogleGenAI, ApiError } from '@google/genai';

const ai = new GoogleGenAI({ apiKey: 'goog-' + process.env.KEY, httpOptions: { baseUrl: process.env.GATEWAY } });
const ask = () => ai.models.generateContent({ model: 'gemini-2.5-flash', contents: 'hi' });

const report = {};
await ask(); // takes the bucket's one token
try {
  await ask();
  report.refused = false;
} catch (e) {
  report.refused = true;
  report.apiError = e instanceof ApiError;
  report.status = e.status;
  const body = JSON.parse(e.message);
  report.grpcStatus = body.error?.status;
  const info = (body.error?.details ?? []).find((d) => d['@type'] === 'type.googleapis.com/google.rpc.RetryInfo');
  report.retryDelay = info?.retryDelay;
  const waitMs = Math.ceil(parseFloat(info?.retryDelay) * 1000);
  await new Promise((resolve) => setTimeout(resolve, waitMs));
  const answer = await ask();
  report.answeredAfterTheDelay = answer.text === 'ok';
}
console.log(JSON.stringify(report));
