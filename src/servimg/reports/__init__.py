"""What is read from judged evidence for people: the provenance card and diff (`servimg show`,
`servimg diff`) and the qualification matrix (`servimg matrix`)."""
