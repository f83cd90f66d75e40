// The deal desk's page: scores the offer of the form with the app's own score_offer tool,
// through the Manage page's bridge (getAppClient() with no arguments: no key, no URL).
import { getAppClient } from './runnerd-frame.js';

const client = getAppClient();
const form = document.getElementById('offer');
const result = document.getElementById('result');
const error = document.getElementById('error');

function offerOf(data) {
  return {
    discountPct: Number(data.get('discountPct')),
    marginPct: Number(data.get('marginPct')),
    termMonths: Number(data.get('termMonths')),
    dealSize: Number(data.get('dealSize')),
    tier: String(data.get('tier')),
  };
}

form.addEventListener('submit', async (event) => {
  event.preventDefault();
  const button = document.getElementById('score');
  button.disabled = true;
  error.hidden = true;
  try {
    const run = await client.runTool('score_offer', offerOf(new FormData(form)));
    if (run.status !== 'succeeded') throw new Error(`score_offer ${run.status}: ${run.error}`);
    const { score, decision, reasons } = run.output;
    document.getElementById('decision').textContent = decision;
    document.getElementById('decision').className = decision;
    document.getElementById('points').textContent = String(score);
    document.getElementById('reasons').replaceChildren(...reasons.map((reason) => {
      const li = document.createElement('li');
      li.textContent = reason;
      return li;
    }));
    result.dataset.runId = run.runId;
    result.hidden = false;
  } catch (err) {
    error.textContent = err.code ? `${err.code}: ${err.message}` : String(err.message || err);
    error.hidden = false;
  } finally {
    button.disabled = false;
  }
});
