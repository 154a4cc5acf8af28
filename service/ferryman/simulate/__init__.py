"""``ferryman simulate``: a traffic shape against one node (the tier simulator) and Doorman's
lease scenarios, second by second on a virtual clock, with the service's own algorithms."""
