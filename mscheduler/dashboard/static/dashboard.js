// Live refresh: the server sends an event when tasks change (or on each poll); the
// overview reloads its data, unless the operator is typing in it.
(function () {
  if (!document.body.dataset.live || !window.EventSource) return;
  var source = new EventSource(document.body.dataset.base + "/events");
  source.onmessage = function () {
    var active = document.activeElement;
    var overview = document.getElementById("overview");
    if (active && active.tagName === "INPUT" && overview && overview.contains(active)) return;
    htmx.trigger(document.body, "refresh");
  };
})();

// An action that asks first (a form with data-confirm: stopping a worker): listened to on the
// document, so forms of a refreshed overview ask too.
document.addEventListener("submit", function (event) {
  var question = event.target.dataset && event.target.dataset.confirm;
  if (question && !window.confirm(question)) event.preventDefault();
});
