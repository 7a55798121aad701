// Drag handles that resize a panel (the sessions sidebar, the Files panel), by mouse, touch or
// the arrow keys; the width is remembered in localStorage.

/**
 * Makes `handle` resize through `apply(width)`: `edge` says where the panel is (`left`: the
 * handle is on its right edge, the panel grows as the pointer moves right; `right`: the other
 * way). Returns the width first applied (the remembered one, else `initial`).
 */
export function resizable(handle, { key, initial, min, max, edge = "left", apply }) {
  const clamp = (width) => Math.round(Math.max(min, Math.min(max(), width)));
  let width = clamp(Number(localStorage.getItem(key)) || initial);
  const set = (next) => {
    width = clamp(next);
    apply(width);
    handle.setAttribute("aria-valuenow", String(width));
  };
  const save = () => localStorage.setItem(key, String(width));
  handle.setAttribute("role", "separator");
  handle.setAttribute("aria-orientation", "vertical");
  handle.setAttribute("aria-valuemin", String(min));
  handle.tabIndex = 0;
  handle.addEventListener("pointerdown", (event) => {
    event.preventDefault();
    handle.setPointerCapture(event.pointerId);
    const startX = event.clientX;
    const startWidth = width;
    document.body.classList.add("resizing");
    const move = (moved) => set(startWidth + (edge === "left" ? 1 : -1) * (moved.clientX - startX));
    const up = () => {
      handle.removeEventListener("pointermove", move);
      handle.removeEventListener("pointerup", up);
      handle.removeEventListener("pointercancel", up);
      document.body.classList.remove("resizing");
      save();
    };
    handle.addEventListener("pointermove", move);
    handle.addEventListener("pointerup", up);
    handle.addEventListener("pointercancel", up);
  });
  handle.addEventListener("keydown", (event) => {
    const step = event.shiftKey ? 40 : 10;
    const grow = edge === "left" ? "ArrowRight" : "ArrowLeft";
    const shrink = edge === "left" ? "ArrowLeft" : "ArrowRight";
    if (event.key === grow) set(width + step);
    else if (event.key === shrink) set(width - step);
    else return;
    event.preventDefault();
    save();
  });
  set(width);
  return width;
}
