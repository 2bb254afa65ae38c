// Opens the conversation page in headless Chromium as a person would: types the key, picks the
// conversation from the list, reads the chart, opens a compaction from its mark and reads the
// summary, and saves a screenshot. Prints what it saw as one JSON line for tests/ui.rs to check.
//
// Environment: UI_BASE (the proxy's URL), UI_KEY, UI_CONVERSATION (the id to pick),
// UI_SCREENSHOT (where the PNG goes), CHROMIUM (default /usr/bin/chromium).
import { chromium } from "playwright-core";

const base = process.env.UI_BASE;
const key = process.env.UI_KEY;
const conversation = process.env.UI_CONVERSATION;
const screenshot = process.env.UI_SCREENSHOT;

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
});
const seen = { requests_to_other_hosts: [], console_errors: [] };
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  page.on("request", (request) => {
    if (!request.url().startsWith(base)) seen.requests_to_other_hosts.push(request.url());
  });
  page.on("console", (message) => {
    if (message.type() === "error") seen.console_errors.push(message.text());
  });
  await page.goto(base + "/compactor/ui");
  await page.fill("#key", key);
  await page.click("#open");
  const row = page.locator(`#conversations tbody tr[data-conversation="${conversation}"]`);
  await row.waitFor({ timeout: 15000 });
  seen.listed = await page.locator("#conversations tbody tr[data-conversation]").count();
  await row.click();
  await page.locator('[data-testid="chart"]').waitFor({ timeout: 15000 });
  seen.sent_points = await page.locator('circle[data-series="sent"]').count();
  seen.forwarded_points = await page.locator('circle[data-series="forwarded"]').count();
  seen.window_lines = await page.locator('[data-testid="window-line"]').count();
  seen.marks = await page.locator('[data-testid="compaction-mark"]').count();
  seen.mark_requests = await page
    .locator('[data-testid="compaction-mark"]')
    .evaluateAll((marks) => marks.map((m) => Number(m.getAttribute("data-request"))));
  seen.request_rows = await page.locator("#requests tbody tr").count();
  seen.checkpoints = await page.locator("details.checkpoint").count();
  // Open the newest compaction still stored from its mark on the chart.
  const stored = await page
    .locator("details.checkpoint")
    .evaluateAll((all) => all.map((d) => d.getAttribute("data-checkpoint")));
  const marks = page.locator('[data-testid="compaction-mark"]');
  let opened = null;
  for (let i = (await marks.count()) - 1; i >= 0; i--) {
    const id = await marks.nth(i).getAttribute("data-checkpoint");
    if (stored.includes(id)) {
      await marks.nth(i).locator("rect").click();
      opened = id;
      break;
    }
  }
  seen.opened = opened;
  if (opened) {
    const details = page.locator(`details.checkpoint[data-checkpoint="${opened}"]`);
    seen.opened_is_open = await details.evaluate((d) => d.open);
    seen.summary = await details.locator(".model-text").innerText();
    seen.code_sections = await details.locator(".code-section").count();
    seen.files_listed = await details.locator(".files li").count();
  }
  await page.screenshot({ path: screenshot, fullPage: true });
} finally {
  await browser.close();
}
console.log(JSON.stringify(seen));
