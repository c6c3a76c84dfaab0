// Live mode, off unless asked: reloads the page every 10 s while the tab is visible,
// and stops by itself 5 minutes after it was turned on. Without it (and without
// JavaScript) the dashboard never reads the database unless a person loads a page.
(function () {
  var EVERY = 10000, FOR = 5 * 60000, KEY = "drainer-live-until";
  var bar = document.querySelector(".live"), button = document.getElementById("live");
  if (!bar || !button) return;
  bar.hidden = false;
  var timer = null;
  function until() { return Number(sessionStorage.getItem(KEY) || 0); }
  function on() { return until() > Date.now(); }
  function stop() { clearTimeout(timer); timer = null; }
  function arm() {
    stop();
    if (on() && document.visibilityState === "visible") {
      timer = setTimeout(function () { if (on()) location.reload(); }, EVERY);
    }
    button.textContent = on() ? "Stop live mode" : "Live for 5 minutes";
  }
  button.addEventListener("click", function () {
    if (on()) sessionStorage.removeItem(KEY);
    else sessionStorage.setItem(KEY, String(Date.now() + FOR));
    arm();
  });
  document.addEventListener("visibilitychange", arm);
  arm();
})();
