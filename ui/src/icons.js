// Small line icons drawn as SVG (built with createElementNS, no markup parsing): the glyphs one
// would use (⛶, ⎙) are missing from many system fonts.
const NS = "http://www.w3.org/2000/svg";

const PATHS = {
  // four corners pointing out
  fullscreen: "M2 6V2h4M10 2h4v4M14 10v4h-4M6 14H2v-4",
  // a page with a folded corner and an arrow down (export)
  report: "M4 1.5h5.5L12.5 4.5V14.5H4z M9.5 1.5v3h3 M8.25 7v5 M6.25 10l2 2 2-2",
  // up-down arrow with bars (y range)
  yrange: "M8 3v10 M5.5 5.5L8 3l2.5 2.5 M5.5 10.5L8 13l2.5-2.5 M3 1.5h10 M3 14.5h10",
};

/**
 * An inline 16×16 icon in the current text color.
 * @param {keyof typeof PATHS} name
 * @returns {SVGSVGElement}
 */
export function icon(name) {
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("viewBox", "0 0 16 16");
  svg.setAttribute("width", "14");
  svg.setAttribute("height", "14");
  svg.setAttribute("aria-hidden", "true");
  svg.setAttribute("class", "icon-svg");
  const path = document.createElementNS(NS, "path");
  path.setAttribute("d", PATHS[name]);
  path.setAttribute("fill", "none");
  path.setAttribute("stroke", "currentColor");
  path.setAttribute("stroke-width", "1.5");
  path.setAttribute("stroke-linecap", "round");
  path.setAttribute("stroke-linejoin", "round");
  svg.append(path);
  return svg;
}
