// The admin page in headless Chromium (playwright-core): a wrong key is
// refused, the right one signs in, an invalid budget is refused naming the
// field, a valid one is saved; prints what it saw as one JSON line and
// leaves a screenshot.
//
//   NODE_PATH=… node admin_page.cjs BASE_URL ADMIN_KEY SCREENSHOT_DIR
const { chromium } = require("playwright-core");

(async () => {
  const [base, key, shots] = process.argv.slice(2);
  const browser = await chromium.launch({
    executablePath: process.env.RAGTIME_TEST_CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox"],
  });
  try {
    const page = await browser.newPage();
    const offsite = [];
    page.on("request", (r) => { if (!r.url().startsWith(base)) offsite.push(r.url()); });
    await page.goto(base + "/admin");
    await page.fill("#key", "not-the-admin-key-at-all");
    await page.click("#sign-in");
    await page.waitForSelector("#login-error:not(:empty)");
    const wrongKey = await page.textContent("#login-error");

    await page.fill("#key", key);
    await page.click("#sign-in");
    await page.waitForSelector("#app:not([hidden]) #budget-embed");
    const before = await page.inputValue("#budget-embed");

    await page.fill("#budget-rerank", "999999");
    await page.click("#save");
    await page.waitForSelector("#err-rerank:not(:empty)");
    const refused = await page.textContent("#err-rerank");
    const versionAfterRefusal = await page.textContent("#version");

    await page.fill("#budget-rerank", "300");
    await page.fill("#budget-embed", "77");
    await page.click("#save");
    await page.waitForFunction(() => document.querySelector("#version").textContent === "version 1");
    const saved = await page.textContent("#save-msg");
    await page.waitForSelector("#history button[data-version='1']");
    const chart = await page.$$eval("#chart .row", (rows) => rows.map((r) => r.dataset.stage));
    await page.waitForSelector("#backends tr[data-backend]");
    const backends = await page.$$eval("#backends tr[data-backend]", (rows) =>
      rows.map((r) => [...r.children].map((c) => c.textContent)));
    const levels = await page.textContent("#levels");
    await page.waitForSelector("#tenants tr[data-tenant]");
    const tenants = await page.$$eval("#tenants tr[data-tenant]", (rows) =>
      rows.map((r) => [...r.children].map((c) => c.textContent)));
    // An experiment, started and stopped from the page.
    await page.fill("#exp-name", "no-rerank");
    await page.fill("#exp-share", "1.5");
    await page.click("#exp-start");
    await page.waitForSelector("#exp-error:not(:empty)");
    const badShare = await page.textContent("#exp-error");
    await page.fill("#exp-share", "0.5");
    await page.click("#exp-start");
    await page.waitForSelector("#experiment-table tr[data-arm='candidate']");
    const arms = await page.$$eval("#experiment-table tr[data-arm]", (rows) => rows.map((r) => r.dataset.arm));
    await page.screenshot({ path: shots + "/admin.png", fullPage: true });
    await page.click("#exp-stop");
    await page.waitForSelector("#experiment-form:not([hidden])");
    const embed = await page.inputValue("#budget-embed");
    const history = await page.$$eval("#history tr", (rows) => rows.length);
    // The API reference: Markdown rendered, the user's routes first.
    await page.goto(base + "/docs");
    await page.waitForSelector("#ops details");
    const docs = await page.evaluate(() => ({
      tags: [...document.querySelectorAll("#ops h2")].map((h) => h.textContent),
      backticks: [...document.querySelectorAll("#intro, #ops")].some((e) => e.textContent.includes("`")),
      code: document.querySelectorAll("#ops code, #intro code").length,
    }));
    console.log(JSON.stringify({
      docs,
      wrongKey, before, refused, versionAfterRefusal, saved, chart, offsite, badShare, arms, backends, levels, tenants,
      embed,
      history,
    }));
  } finally {
    await browser.close();
  }
})().catch((e) => { console.error(e); process.exit(1); });
