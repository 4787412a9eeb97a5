"""The results page's style sheet and script (kvbench.report.html writes them inline)."""

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:0 auto;
 max-width:1400px;padding:0 1.2rem 4rem;color:#1d2430;background:#fbfbfc}
h1{margin:1.2rem 0 .2rem}h2{margin-top:2.2rem;border-bottom:1px solid #d8dde6;padding-bottom:.2rem}
.lede,.note{color:#4a5565}.muted{color:#7a8494;font-weight:normal}
.scroll{overflow-x:auto;border:1px solid #e1e5ec;border-radius:6px;background:#fff}
nav#contents ul{columns:3;margin:.3rem 0 0}
table{border-collapse:collapse;width:100%}th,td{padding:.28rem .6rem;text-align:left;
 border-bottom:1px solid #eef0f4;white-space:nowrap}thead th{position:sticky;top:0;
 background:#f1f4f8;z-index:1}table.sortable thead th{cursor:pointer;user-select:none}
th.asc::after{content:' ▲'}th.desc::after{content:' ▼'}td.num{text-align:right;
 font-variant-numeric:tabular-nums}tr.front td{background:#fff8e1}.star{color:#c77c00}
a{color:#1f5fbf;text-decoration:none}a:hover{text-decoration:underline}
.verdict.held{color:#137333;font-weight:600}.verdict.failed{color:#c5221f;font-weight:600}
.verdict.missing{color:#b06000;font-weight:600}
fieldset{border:1px solid #d8dde6;border-radius:6px;margin:1.2rem 0}fieldset label{
 margin-right:1rem;white-space:nowrap}
figure{display:inline-block;margin:.6rem;max-width:46%;vertical-align:top}
figure img{max-width:100%;border:1px solid #e1e5ec;background:#fff}
figcaption{color:#4a5565;font-size:12px}
details{border-bottom:1px solid #eef0f4;padding:.2rem 0}details[open]{background:#fff}
summary{cursor:pointer}table.facts th{width:12rem;background:none;position:static}
tr.hidden,tr.held-hidden{display:none}td.params{white-space:normal;min-width:12rem;max-width:28rem}
td.why{white-space:normal;min-width:30rem}
"""

# Sorting by a column (numbers by their exact value, in data-v), the family filter, the claims
# not held, and opening the case a link points to.
SCRIPT = """
(function(){
function key(td){var v=td.getAttribute('data-v');if(v!==null&&v!==''){return [0,parseFloat(v)];}
 return [1,td.textContent.trim().toLowerCase()];}
function cmp(a,b){if(a[0]!==b[0])return a[0]-b[0];return a[1]<b[1]?-1:a[1]>b[1]?1:0;}
document.querySelectorAll('table.sortable').forEach(function(table){
 table.querySelectorAll('thead th').forEach(function(th,col){
  th.addEventListener('click',function(){
   var desc=th.classList.contains('asc');
   table.querySelectorAll('thead th').forEach(function(o){o.classList.remove('asc','desc');});
   th.classList.add(desc?'desc':'asc');
   var body=table.tBodies[0],rows=Array.prototype.slice.call(body.rows);
   rows.sort(function(a,b){var r=cmp(key(a.cells[col]),key(b.cells[col]));return desc?-r:r;});
   rows.forEach(function(r){body.appendChild(r);});});});});
function filter(){var shown={};
 document.querySelectorAll('input.family').forEach(function(b){shown[b.value]=b.checked;});
 document.querySelectorAll('tr[data-family]').forEach(function(r){
  r.classList.toggle('hidden',!shown[r.getAttribute('data-family')]);});}
document.querySelectorAll('input.family').forEach(function(b){b.addEventListener('change',filter);});
var all=document.getElementById('all-families');
if(all){all.addEventListener('click',function(){
 document.querySelectorAll('input.family').forEach(function(b){b.checked=true;});filter();});}
var notHeld=document.getElementById('claims-not-held');
if(notHeld){notHeld.addEventListener('change',function(){
 document.querySelectorAll('#claims tr[data-verdict]').forEach(function(r){
  r.classList.toggle('held-hidden',notHeld.checked&&r.getAttribute('data-verdict')==='held');});});}
function openCase(){var id=location.hash.slice(1),el=id&&document.getElementById(id);
 if(el&&el.tagName==='DETAILS'){el.open=true;el.scrollIntoView();}}
window.addEventListener('hashchange',openCase);openCase();
})();
"""
