// The page's CSP admits `<style>` elements only with its nonce and no `style` attributes from
// markup. Libraries the console vendors (xterm.js, mermaid) make `<style>` elements and set
// `style` attributes from script: stamp the nonce on every `<style>` element when it is created
// (before it is inserted, when it counts), and let a script's `style` attribute go through the
// CSSOM, which the CSP allows. Markup (an HTML string parsed into the page) still cannot style.

export const NONCE = document.querySelector('meta[name="csp-nonce"]')?.content;

if (NONCE && !Document.prototype.createElement.stampsNonce) {
  const create = Document.prototype.createElement;
  const createNS = Document.prototype.createElementNS;
  const stamp = (element, name) => {
    if (String(name).toLowerCase().endsWith("style")) element.setAttribute("nonce", NONCE);
    return element;
  };
  const stamped = function (name, options) { return stamp(create.call(this, name, options), name); };
  const stampedNS = function (ns, name, options) { return stamp(createNS.call(this, ns, name, options), name); };
  stamped.stampsNonce = true;
  Document.prototype.createElement = stamped;
  Document.prototype.createElementNS = stampedNS;

  const setAttribute = Element.prototype.setAttribute;
  Element.prototype.setAttribute = function (name, value) {
    if (String(name).toLowerCase() === "style" && this.style) {
      this.style.cssText = String(value);
      return;
    }
    setAttribute.call(this, name, value);
  };
}
