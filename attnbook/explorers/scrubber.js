// What a scrubber's range input runs when it moves (`this` is the input). The frame to show is the sum of
// each range's position times its stride (the first control varies slowest); each range's label shows
// its value. Lines are trimmed and joined without separators into the one line of the oninput attribute,
// so every line ends with ; { } , ( or [ (no semicolon is inserted at a line break that is gone), strings
// close on their line, and a comment is a line of its own starting with // (dropped) or /* */: a // after
// code would comment out the rest of the script. ScrubberTemplate.parse (base.py) checks these rules.
var r=this.closest('.attnbook-explorer'),i=0;
r.querySelectorAll('input.ab-range').forEach(function(s){
  i+=s.value*s.dataset.stride;
  s.parentNode.querySelector('.ab-value').textContent=JSON.parse(s.dataset.labels)[s.value];});
r.querySelectorAll('.ab-frame').forEach(function(f){f.style.display=(f.dataset.i==i)?'':'none';});
